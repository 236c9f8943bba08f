// The Python module `ops._C`. It holds no Python functions: importing it loads
// the shared library, whose static TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL
// initialisers register every op with the dispatcher (torch.ops.kgreason.*).
// Plain CPython module init instead of pybind11 keeps every translation unit
// free of <torch/extension.h>, which is what makes a rebuild take minutes.
#include <Python.h>

extern "C" {
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",  // name
      "Compiled kernels of kgreason; the ops live in torch.ops.kgreason.",
      -1,       // no per-module state
      nullptr,  // no methods
  };
  return PyModule_Create(&module_def);
}
}
