"""The OpenAI Agents SDK at our edge: agents run as task steps, our records the authority."""
