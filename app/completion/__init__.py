"""The IDE completion surface: /v1/completions (Tabby's and OpenAI's bodies), llama.cpp's
/infill, Tabby's events and settings, repository indexing requests."""
