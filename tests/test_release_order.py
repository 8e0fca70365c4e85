"""Release strings are ordered by PEP 440 (``packaging``): what ``release_for`` reads an unknown
server version as depends on it."""

from __future__ import annotations

from eagledata.profiles.releases import release_for, releases, version_key


def test_release_strings_sort_as_pep_440_says() -> None:
    shuffled = ["0.5.24", "junk", "0.5.15.post1", "0.5.24rc1", "v0.5.10", "0.5.9", "0.5.24.dev0"]
    assert sorted(shuffled, key=version_key) == [
        "junk",  # no version: first
        "0.5.9",
        "v0.5.10",
        "0.5.15.post1",
        "0.5.24.dev0",
        "0.5.24rc1",
        "0.5.24",
    ]


def test_an_unknown_version_reads_as_the_newest_known_release_at_or_below_it() -> None:
    known = [release.version for release in releases()]
    newest = max(known, key=version_key)
    assert release_for(newest + ".post7") == (release_for(newest)[0], False)
    assert release_for("999.0rc1")[0].version == newest
    oldest = min(known, key=version_key)
    assert release_for("0.0.1")[0].version == oldest  # below them all: the oldest
