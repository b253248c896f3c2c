"""OpenAI semantics: request validation, errors, usage and server-sent events."""
