"""eagledata: token-faithful EAGLE-3 drafter training data from an SGLang server (bf16 KV only)."""

__version__ = "0.1.0"
