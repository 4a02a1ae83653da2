"""The power-cut test of test_powercut.py at length: 200 cuts under the intake and the
relay (about 4 minutes), in the plain build only."""

import os

from conftest import plain_only
from test_powercut import SEED, assert_durable, describe, forgetdisk, pytestmark, \
    run_scenario  # noqa: F401 (pytestmark: skipped without /dev/fuse)

CUTS = int(os.environ.get("SLUICE_POWERCUT_CUTS", "200"))


@plain_only
def test_two_hundred_power_cuts_lose_nothing(sluiced, workdir):
    r = run_scenario(sluiced, workdir, cuts=CUTS, nmessages=50000, seed=SEED + 200,
                     preload=forgetdisk.SYNCFS_BRIDGE, pace=0.3)
    print("\n" + describe(r))
    assert_durable(r)
    assert r["cuts"] >= CUTS
