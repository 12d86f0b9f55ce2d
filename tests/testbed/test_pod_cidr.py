"""Pod ranges of local clusters that run at once (the e2e tier's parallel workers, two runs on
one machine): each live cluster holds its /16 of the loopback range, no two share one."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest

from pdscale.testbed.localcluster import ClusterError, claim_pod_cidr


def test_ranges_held_at_once_are_distinct_and_freed_on_close(tmp_path: Path):
    claims = [claim_pod_cidr(tmp_path) for _ in range(40)]
    cidrs = [cidr for cidr, _ in claims]
    assert len(set(cidrs)) == len(cidrs)
    for cidr in cidrs:
        net = ipaddress.ip_network(cidr, strict=False)
        assert net.prefixlen == 16 and net.subnet_of(ipaddress.ip_network("127.0.0.0/8"))
        assert net.network_address not in (ipaddress.ip_address("127.0.0.0"),
                                           ipaddress.ip_address("127.1.0.0"))
    for _, handle in claims:
        handle.close()
    # all free again: every one of the 253 ranges can be held at once
    everything = [claim_pod_cidr(tmp_path) for _ in range(253)]
    assert len({cidr for cidr, _ in everything}) == 253
    with pytest.raises(ClusterError, match="held by a live cluster"):
        claim_pod_cidr(tmp_path)
    for _, handle in everything:
        handle.close()


def test_a_range_held_by_another_process_is_not_handed_out(tmp_path: Path):
    # another process (another pytest worker) holds all ranges but one
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from pdscale.testbed.localcluster import claim_pod_cidr\n"
        "held = [claim_pod_cidr(Path(sys.argv[1])) for _ in range(252)]\n"
        "print(' '.join(c for c, _ in held), flush=True)\n"
        "sys.stdin.read()\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None
        theirs = set(other.stdout.readline().split())
        assert len(theirs) == 252
        mine, handle = claim_pod_cidr(tmp_path)
        assert mine not in theirs
        with pytest.raises(ClusterError):
            claim_pod_cidr(tmp_path)
        handle.close()
    finally:
        other.communicate("")
    # the other process gone, its ranges are free
    again = [claim_pod_cidr(tmp_path) for _ in range(253)]
    for _, handle in again:
        handle.close()
