"""Bytes, framing and connections: the HTTP server, the engine connections, the pool of
kept-alive ones and the stream relay. Nothing here knows OpenAI."""
