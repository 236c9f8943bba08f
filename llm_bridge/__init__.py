"""Bridge between the KG engine and OpenAI-compatible LLMs (LGOT). Not implemented yet: no issue has asked for it."""
