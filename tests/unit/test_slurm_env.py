"""minitrain.hosts.slurm_env: Slurm's hostlists and compressed counts (Slurm's documented examples, then
properties: round trips through the compressors below, which minitrain itself never needs), the slots rule,
and every bad value's message (variable, value, fix); Slurm's requeue count (SLURM_RESTART_COUNT);
minitrain.hosts.cluster's Slurm mode and its precedence."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitrain.errors import ConfigError
from minitrain.hosts import cluster, slurm_env
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.slurm_env import SlurmEnvironmentError, expand_counts, expand_hostlist

_SUFFIX = re.compile(r"(.*?)(\d+)")


def compress_hostlist(names: Iterable[str]) -> str:
    """A hostlist that `expand_hostlist` turns back into `names` (host names: no brackets or commas), in the
    same order.

    Neighbours that share a prefix and end in consecutive numbers of a width the range keeps become
    one bracket group (``n01, n02, n03, x`` -> ``n[01-03],x``); nothing is reordered, so the result is
    longer than Slurm's own for a shuffled list.
    """
    entries: list[tuple[str, list[list[str]]]] = []  # (prefix, ranges as [low text, high text])
    for name in names:
        match = _SUFFIX.fullmatch(name)
        if match is None:
            entries.append((name, []))
            continue
        prefix, digits = match.groups()
        if entries and entries[-1][1] and entries[-1][0] == prefix:
            ranges = entries[-1][1]
            low, high = ranges[-1]
            if int(digits) == int(high) + 1 and str(int(digits)).zfill(len(low)) == digits:
                ranges[-1][1] = digits
            else:
                ranges.append([digits, digits])
        else:
            entries.append((prefix, [[digits, digits]]))
    parts = []
    for prefix, ranges in entries:
        if not ranges:
            parts.append(prefix)
        elif len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            parts.append(prefix + ranges[0][0])
        else:
            parts.append(prefix + "[" + ",".join(low if low == high else f"{low}-{high}"
                                                 for low, high in ranges) + "]")
    return ",".join(parts)


def compress_counts(counts: Sequence[int]) -> str:
    """Slurm's compressed form of `counts`: (4, 4, 2) -> ``4(x2),2``; `expand_counts` inverts it."""
    parts: list[str] = []
    index = 0
    while index < len(counts):
        run = 1
        while index + run < len(counts) and counts[index + run] == counts[index]:
            run += 1
        parts.append(str(counts[index]) if run == 1 else f"{counts[index]}(x{run})")
        index += run
    return ",".join(parts)


# ---------------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize("text, names", [
    # slurm.conf(5), NodeName: "alpha,beta,gamma", "linux[0-64,128]", "lx[15,18,32-33]", "linux[0000-1023]"
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
    ("lx[15,18,32-33]", ["lx15", "lx18", "lx32", "lx33"]),
    # sbatch(1)/srun(1), --nodelist: "host[1-5,7,...]"
    ("host[1-5,7]", ["host1", "host2", "host3", "host4", "host5", "host7"]),
    # the example: zero padding, a plain name after the brackets
    ("gpu[01-04,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu5"]),
    ("n[1-2]", ["n1", "n2"]),  # what anchors-3 §1.6 measured on Debian's Slurm 22.05
    ("10.76.132.[10-11]", ["10.76.132.10", "10.76.132.11"]),  # the test cluster's nodes, named by address
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("node[8-10]", ["node8", "node9", "node10"]),  # the width is the lower bound's: no padding here
    ("node[08-10]", ["node08", "node09", "node10"]),
    ("single", ["single"]),
    (" a[1-2] , b ", ["a1", "a2", "b"]),
    ("[1-3]x", ["1x", "2x", "3x"]),
])
def test_expand_hostlist(text, names):
    assert list(expand_hostlist(text)) == names


def test_expand_slurm_conf_large_examples():
    assert expand_hostlist("linux[0-64,128]") == tuple(f"linux{i}" for i in [*range(65), 128])
    assert expand_hostlist("linux[0000-1023]") == tuple(f"linux{i:04d}" for i in range(1024))
    blades = expand_hostlist("rack[0-63]_blade[0-41]")  # slurm.conf(5): several numeric ranges
    assert len(blades) == 64 * 42 and blades[:2] == ("rack0_blade0", "rack0_blade1")
    assert blades[42] == "rack1_blade0" and blades[-1] == "rack63_blade41"


@pytest.mark.parametrize("text, needle", [
    ("", "names no host"),
    ("a,,b", "empty entry"),
    ("a,", "empty entry"),
    ("n[1-2", "never closed"),
    ("n1-2]", "']' without its '['"),
    ("n[[1-2]]", "bracket inside a bracket"),
    ("n[3-1]", "runs backwards"),
    ("n[1-x]", "neither a number nor a range"),
    ("n[]", "neither a number nor a range"),
    ("n[1-2],n2", "'n2' twice"),
    ("a b", "a character no host name has"),
    ("n[0-99999999]", "more than"),
])
def test_bad_hostlists_name_the_variable_the_value_and_the_fix(text, needle):
    with pytest.raises(SlurmEnvironmentError) as caught:
        expand_hostlist(text, "SLURM_JOB_NODELIST")
    message = str(caught.value)
    assert needle in message
    assert message.startswith(f"SLURM_JOB_NODELIST={text!r}: ")
    assert "minitrain.init(hosts=...)" in message  # the way out
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize("names, text", [
    (["n1", "n2", "n3", "x"], "n[1-3],x"),
    (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu5"], "gpu[01-04,07],cpu5"),
    (["n9", "n10"], "n[9-10]"),
    (["n09", "n10"], "n[09-10]"),
    (["n01", "n2"], "n[01,2]"),
    (["a", "b"], "a,b"),
    (["n2", "n1"], "n[2,1]"),  # order kept
])
def test_compress_hostlist(names, text):
    assert compress_hostlist(names) == text
    assert list(expand_hostlist(text)) == names


_host = st.builds(lambda prefix, number, width: prefix + (str(number).zfill(width) if width else ""),
                  st.sampled_from(["n", "gpu", "rack1-node", "10.0.0.", "a.b-c_", ""]),
                  st.integers(0, 130), st.integers(0, 4)).filter(bool)


@given(st.lists(_host, unique=True, min_size=1, max_size=40))
def test_compress_then_expand_gives_the_names_back(names):
    assert list(expand_hostlist(compress_hostlist(names))) == names


@given(st.lists(st.tuples(st.sampled_from(["n", "x"]), st.integers(0, 50), st.integers(0, 20), st.integers(1, 3)),
                min_size=1, max_size=5))
def test_expanding_ranges_matches_their_definition(groups):
    """A hostlist of ranges, written out by hand, expands to each number padded to its lower bound's width."""
    expected, parts = [], []
    for index, (prefix, low, span, width) in enumerate(groups):
        name = f"{prefix}{index}_"  # distinct prefixes: no name repeats
        expected += [name + str(n).zfill(width) for n in range(low, low + span + 1)]
        parts.append(f"{name}[{str(low).zfill(width)}-{low + span}]")
    assert list(expand_hostlist(",".join(parts))) == expected


# ---------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("text, counts", [
    ("2(x3),1", [2, 2, 2, 1]),  # sbatch(1), SLURM_TASKS_PER_NODE
    ("72(x2),36", [72, 72, 36]),  # sbatch(1), SLURM_JOB_CPUS_PER_NODE
    ("4(x2),2", [4, 4, 2]),
    ("1(x2)", [1, 1]),
    ("8", [8]),
])
def test_expand_counts(text, counts):
    assert list(expand_counts(text)) == counts
    assert compress_counts(counts) == text


@pytest.mark.parametrize("text", ["", "4(x0)", "4(2)", "x", "4,,2", "-1", "4(x2"])
def test_bad_counts_name_the_variable_and_value(text):
    with pytest.raises(SlurmEnvironmentError, match=r"^SLURM_JOB_CPUS_PER_NODE=.*'N\(xK\)'"):
        expand_counts(text, "SLURM_JOB_CPUS_PER_NODE")


@given(st.lists(st.integers(0, 9), max_size=30).filter(bool))
def test_compress_then_expand_counts_gives_them_back(counts):
    assert list(expand_counts(compress_counts(counts))) == counts


# ---------------------------------------------------------------------------------- the allocation

JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-02],cpu5", "SLURM_TASKS_PER_NODE": "1(x3)",
       "SLURM_JOB_CPUS_PER_NODE": "16(x2),4"}


def test_outside_an_allocation_there_is_none():
    assert slurm_env.allocation_from_environment({}) is None
    assert slurm_env.allocation_from_environment({"SLURM_JOB_NODELIST": "n1"}) is None


def test_cpus_per_node_when_no_tasks_or_gpus_were_asked_for():
    allocation = slurm_env.allocation_from_environment(JOB)
    assert allocation.job_id == "42"
    assert allocation.nodes == ("gpu01", "gpu02", "cpu5")
    assert allocation.slots == (16, 16, 4) and allocation.slots_from == "SLURM_JOB_CPUS_PER_NODE"


@pytest.mark.parametrize("asked", ["SLURM_NTASKS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS"])
def test_tasks_per_node_when_tasks_were_asked_for(asked):
    allocation = slurm_env.allocation_from_environment({**JOB, asked: "3", "SLURM_TASKS_PER_NODE": "2(x2),1"})
    assert allocation.slots == (2, 2, 1) and allocation.slots_from == "SLURM_TASKS_PER_NODE"


@pytest.mark.parametrize("extra, slots, source", [
    ({"SLURM_GPUS_PER_NODE": "4"}, 4, "SLURM_GPUS_PER_NODE"),
    ({"SLURM_GPUS_PER_NODE": "a100:2,v100:1"}, 3, "SLURM_GPUS_PER_NODE"),
    ({"SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_GPUS": "0,1"}, 8, "SLURM_GPUS_ON_NODE"),
    ({"SLURM_JOB_GPUS": "0,1,2,3"}, 4, "SLURM_JOB_GPUS"),
    ({"SLURM_STEP_GPUS": "2,3"}, 2, "SLURM_STEP_GPUS"),
])
def test_gpus_per_node_win_when_the_job_has_gpus(extra, slots, source):
    allocation = slurm_env.allocation_from_environment({**JOB, "SLURM_NTASKS": "3", **extra})
    assert allocation.slots == (slots,) * 3 and allocation.slots_from == source


def test_no_gpus_on_the_node_falls_back_to_cpus():
    allocation = slurm_env.allocation_from_environment({**JOB, "SLURM_GPUS_ON_NODE": "0"})
    assert allocation.slots_from == "SLURM_JOB_CPUS_PER_NODE"


def test_the_old_nodelist_name_is_read_when_the_new_one_is_missing():
    env = {**JOB, "SLURM_NODELIST": "n[1-3]"}
    del env["SLURM_JOB_NODELIST"]
    assert slurm_env.allocation_from_environment(env).nodes == ("n1", "n2", "n3")


@pytest.mark.parametrize("change, needle", [
    ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST='': is not set although SLURM_JOB_ID=42 is"),
    ({"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST='n[1-': has a '[' that is never closed"),
    ({"SLURM_JOB_CPUS_PER_NODE": "16(x2)"}, "SLURM_JOB_CPUS_PER_NODE='16(x2)': counts 2 node(s) but "
                                            "SLURM_JOB_NODELIST names 3"),
    ({"SLURM_JOB_CPUS_PER_NODE": "16(x2),0"}, "gives a node no room"),
    ({"SLURM_JOB_CPUS_PER_NODE": "lots"}, "SLURM_JOB_CPUS_PER_NODE='lots': has 'lots'"),
    ({"SLURM_GPUS_PER_NODE": "a100:many"}, "SLURM_GPUS_PER_NODE='a100:many': has 'a100:many', which is not "
                                           "'N' or 'TYPE:N'. Expected what --gpus-per-node takes"),
    ({"SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE='two': is not a count"),
    ({"SLURM_JOB_CPUS_PER_NODE": None, "SLURM_TASKS_PER_NODE": None}, "is not set inside an allocation"),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "SLURM_STEP_NUM_TASKS='2': this driver is one of "
                                                          "several tasks"),
])
def test_bad_allocations_name_the_variable_the_value_and_the_fix(change, needle):
    env = {**JOB, **{k: v for k, v in change.items() if v is not None}}
    for name in [k for k, v in change.items() if v is None]:
        del env[name]
    with pytest.raises(SlurmEnvironmentError) as caught:
        slurm_env.allocation_from_environment(env)
    message = str(caught.value)
    assert needle in message
    variable, _, rest = message.partition("=")
    assert variable.startswith("SLURM_") and rest.startswith("'")  # the variable and its value
    assert re.search(r"\. [A-Z]", rest)  # then what is wrong, then the fix in a sentence of its own


def test_a_driver_that_is_the_only_task_of_a_step_is_fine():
    env = {**JOB, "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_TASKS": "1"}
    assert slurm_env.allocation_from_environment(env).nodes[0] == "gpu01"


# ---------------------------------------------------------------------------------- Slurm mode and precedence


def test_cluster_from_slurm():
    made = cluster.cluster_from_slurm(JOB)
    assert made == ClusterConfig(hosts=(HostSpec("gpu01", 16, local=False), HostSpec("gpu02", 16, local=False),
                                        HostSpec("cpu5", 4, local=False)), launcher="srun", slurm_job_id="42")
    assert not made.all_local  # even a node named localhost would get its agent as a step


def test_cluster_from_slurm_outside_and_switched_off():
    assert cluster.cluster_from_slurm({}) is None
    assert cluster.cluster_from_slurm({**JOB, "MINITRAIN_SLURM": "0"}) is None
    assert cluster.cluster_from_slurm({**JOB, "MINITRAIN_SLURM": "auto"}) is not None
    assert cluster.cluster_from_slurm({**JOB, "MINITRAIN_SLURM": "1"}) is not None
    with pytest.raises(ConfigError, match="MINITRAIN_SLURM=1 requires a Slurm allocation, but SLURM_JOB_ID is "
                                          "not set. Run inside sbatch or salloc, or unset MINITRAIN_SLURM."):
        cluster.cluster_from_slurm({"MINITRAIN_SLURM": "1"})
    with pytest.raises(ConfigError, match="MINITRAIN_SLURM='maybe': .*auto"):
        cluster.cluster_from_slurm({**JOB, "MINITRAIN_SLURM": "maybe"})


def test_a_node_name_minitrain_cannot_use_is_refused_with_the_variable():
    with pytest.raises(SlurmEnvironmentError, match="SLURM_JOB_NODELIST names '-n1'"):
        cluster.cluster_from_slurm({**JOB, "SLURM_JOB_NODELIST": "-n1,a,b"})


def test_launcher_and_job_id_go_together():
    hosts = (HostSpec("n1"),)
    with pytest.raises(ConfigError, match="ClusterConfig.launcher must be one of"):
        ClusterConfig(hosts=hosts, launcher="pdsh")
    with pytest.raises(ConfigError, match="slurm_job_id must be the allocation's job id exactly when"):
        ClusterConfig(hosts=hosts, launcher="srun")
    with pytest.raises(ConfigError, match="slurm_job_id must be the allocation's job id exactly when"):
        ClusterConfig(hosts=hosts, slurm_job_id="7")


@pytest.fixture
def ambient(monkeypatch):
    """No init() cluster, no MINITRAIN_HOSTS/HOSTFILE/SLURM, no Slurm job; restored afterwards."""
    for name in ("MINITRAIN_HOSTS", "MINITRAIN_HOSTFILE", "MINITRAIN_SLURM", *[k for k in os.environ if k.startswith("SLURM_")]):
        monkeypatch.delenv(name, raising=False)
    saved = cluster._initialized
    cluster.shutdown()
    yield monkeypatch
    cluster._initialized = saved


def test_precedence_init_then_minitrain_hosts_then_slurm_then_localhost(ambient):
    for name, value in JOB.items():
        ambient.setenv(name, value)
    assert cluster.current_cluster().launcher == "srun"  # inside an allocation, no explicit hosts
    ambient.setenv("MINITRAIN_HOSTS", "h1:2")
    assert cluster.current_cluster().hosts == (HostSpec("h1", 2),)  # explicit hosts override, over ssh
    assert cluster.current_cluster().launcher == "ssh"
    made = cluster.init(hosts="h9")
    assert cluster.current_cluster() is made
    cluster.shutdown()
    ambient.delenv("MINITRAIN_HOSTS")
    ambient.setenv("MINITRAIN_SLURM", "0")
    assert cluster.current_cluster().all_local  # Slurm mode off: as outside an allocation
    ambient.delenv("MINITRAIN_SLURM")
    ambient.delenv("SLURM_JOB_ID")
    assert cluster.current_cluster().all_local  # outside an allocation nothing changes


def test_slurm_s_restart_count_is_read_and_checked():
    assert slurm_env.restart_count({}) == 0
    assert slurm_env.restart_count({"SLURM_RESTART_COUNT": "3"}) == 3
    with pytest.raises(slurm_env.SlurmEnvironmentError, match="SLURM_RESTART_COUNT='x'"):
        slurm_env.restart_count({"SLURM_RESTART_COUNT": "x"})
