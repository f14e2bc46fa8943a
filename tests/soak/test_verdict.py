"""The soak's memory and latency verdicts on made-up series: growth that levels off passes,
growth that goes on and live memory that is not given back fail."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak  # noqa: E402

MB = 2**20


def idle(live_mb):
    return {"quantd_heap_in_use_bytes": live_mb * MB}


def test_rss_that_levels_off_with_live_heap_given_back_passes():
    # arenas filling: fast at first, then slower, then flat, with request-sized swings on top
    rss = [300 * (1 - 0.5 ** (i / 20)) + (37 if i % 3 == 0 else 0) for i in range(200)]
    failures, figures = soak.memory_verdict(rss, idle(40), idle(44))
    assert failures == []
    assert figures["live_heap_idle"] == [40, 44]


def test_rss_still_growing_in_the_last_quarter_fails():
    rss = [100 + i for i in range(200)]  # 1 MB a sample to the end
    failures, _ = soak.memory_verdict(rss, idle(40), idle(40))
    assert len(failures) == 1 and failures[0].startswith("RSS still growing")


def test_live_heap_kept_after_the_soak_is_a_leak():
    rss = [300] * 200  # RSS level (the leak hides in the allocator's free memory)
    failures, _ = soak.memory_verdict(rss, idle(40), idle(40 + soak.LEAK_MB + 1))
    assert len(failures) == 1 and failures[0].startswith("live heap grew")


def test_rss_over_the_bound_fails():
    rss = [100] * 100 + [soak.RSS_LIMIT_MB + 1] + [100] * 99
    failures, _ = soak.memory_verdict(rss, idle(40), idle(40))
    assert failures == [f"RSS reached {soak.RSS_LIMIT_MB + 1} MB (bound {soak.RSS_LIMIT_MB} MB)"]


def test_no_heap_figures_fails():
    failures, _ = soak.memory_verdict([100] * 200, None, idle(40))
    assert failures and failures[0].startswith("no heap figures")


def test_healthz_latencies_are_split_by_flood():
    health = [(t, 50.0 if 10 <= t <= 12 else 1.0) for t in range(100)]  # slow from 10 to 12 s
    figures = soak.healthz_figures(health, [(10, 11.5)])
    assert figures["floods"]["n"] == 3 and figures["floods"]["max"] == 50.0
    assert figures["between_floods"]["n"] == 97 and figures["between_floods"]["max"] == 1.0
