"""An OpenAI-compatible HTTP server over one engine (`swajax serve`; the `serve` extra)."""
