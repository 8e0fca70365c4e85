"""Launch profiles (one TOML file per SGLang server configuration) and the model facts they hold.

``profile`` is one profile (``Profile``: its checks, what the planner and launcher read, its
flags in a release's spelling), ``sections`` its tables beside the flags, ``sglang_args`` the
rules of its flags, ``loading`` finding and reading the files; ``releases`` the SGLang releases,
``rigs`` the GPUs, ``kv`` the model's KV cell.
"""
