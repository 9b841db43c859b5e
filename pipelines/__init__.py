"""The product's pipelines: support chat (intent -> retrieval -> generation -> compliance) and code
completion. No Flask and no torch here: the engine is reached through `inference_client`."""
