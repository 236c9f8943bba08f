"""Query engine: query language, batched executor with explanations, evaluation, sampling, path search."""
