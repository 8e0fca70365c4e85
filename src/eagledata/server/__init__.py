"""The server side: the only HTTP to SGLang, its facts, the bf16 guard, and launching it.

``client`` (over ``pools``), ``answers`` and ``responses`` speak SGLang's HTTP contract;
``serverfacts`` and ``guard`` judge a server (read as its release reports, ``profiles/releases``);
``launch`` starts one from a checked profile, in the spelling of the release it launches.
"""
