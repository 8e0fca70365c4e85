"""Launch profiles (one TOML file per SGLang server configuration) and the model facts they hold."""
