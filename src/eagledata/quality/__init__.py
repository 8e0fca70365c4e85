"""Quality, measured: record flags (``flags``) and the logprob canary (``canary``)."""
