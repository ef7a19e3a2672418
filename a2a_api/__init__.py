"""The A2A v1.0 surface: the agent card and the JSON-RPC binding, as plain Django views over our models."""
