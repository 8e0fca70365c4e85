"""The server side: the only HTTP to SGLang, its facts, the bf16 guard, and launching it.

``client`` (over ``pools``), ``answers`` and ``responses`` speak SGLang's HTTP contract;
``serverfacts`` reads a server (as its release reports, ``profiles/releases``), ``verdict`` and
``guard`` judge it, ``facts_report`` shows both;
``launch`` starts one from a checked profile (``launch_args``: its argv holds bf16 KV;
``launch_release``: the release it is spelled for; ``readiness``: ``/health`` and the guard).
"""
