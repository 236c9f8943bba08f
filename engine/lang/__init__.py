"""The query language: typed AST, S-expressions, name resolution, the BetaE structures."""
