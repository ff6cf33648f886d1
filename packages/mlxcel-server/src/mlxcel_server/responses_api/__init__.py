"""OpenAI's Responses API: request and response models, the event stream, the response store."""
