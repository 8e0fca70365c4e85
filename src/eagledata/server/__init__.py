"""The server side: the only HTTP to SGLang, its facts, the bf16 guard, and launching it.

``client`` (over ``pools``), ``answers`` and ``responses`` speak SGLang's HTTP contract;
``serverfacts`` and ``guard`` judge a server; ``launch``, ``profiles`` and ``sglang_flags`` start
one from a checked profile.
"""
