"""HTTP plumbing shared by the web apps (`app/`) and the inference service
(`inference/server/`): OpenAPI document generation and graceful shutdown. No torch."""
