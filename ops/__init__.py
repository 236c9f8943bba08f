"""Fuzzy-set operators on batches of fuzzy vectors, with C++ (OpenMP) and CUDA kernels."""
