"""minitrain.hosts.cluster: host lists, hostfiles (every error with its line number), SSH option validation,
the environment variables, and the ambient cluster of init()/current_cluster()/shutdown()."""

from __future__ import annotations

import os
import sys

import pytest

from minitrain import knobs
from minitrain.errors import ConfigError
from minitrain.hosts import cluster
from minitrain.hosts.cluster import ClusterConfig, HostSpec, SSHOptions, parse_host_list, parse_hostfile


@pytest.fixture
def clean_cluster(monkeypatch):
    """No init() cluster, no MINITRAIN_HOSTS/HOSTFILE and no Slurm job (the suite may run inside sbatch);
    the module state is restored afterwards."""
    monkeypatch.delenv(cluster.HOSTS_ENV_VAR, raising=False)
    monkeypatch.delenv(cluster.HOSTFILE_ENV_VAR, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    saved = cluster._initialized
    cluster.shutdown()
    yield
    cluster._initialized = saved


# ---------------------------------------------------------------------------------- host lists


def test_host_list_items():
    hosts = parse_host_list(["gpu1:8", "gpu2:8", "10.0.0.3", "localhost:2"])
    assert hosts == (HostSpec("gpu1", 8, local=False), HostSpec("gpu2", 8, local=False),
                     HostSpec("10.0.0.3", None, local=False), HostSpec("localhost", 2, local=True))


def test_host_list_comma_separated_string_and_spaces():
    assert parse_host_list(" gpu1:4 , gpu2 ,") == (HostSpec("gpu1", 4), HostSpec("gpu2"))
    assert parse_host_list(["a,b:2", "c"]) == (HostSpec("a"), HostSpec("b", 2), HostSpec("c"))


def test_host_list_ipv6():
    hosts = parse_host_list("[::1]:2,[fe80::1%eth0],2001:db8::7")
    assert hosts == (HostSpec("::1", 2, local=True), HostSpec("fe80::1%eth0", None, local=False),
                     HostSpec("2001:db8::7", None, local=False))


@pytest.mark.parametrize("name", ["localhost", "LOCALHOST", "127.0.0.1", "::1"])
def test_local_names(name):
    assert HostSpec(name).local is True
    assert HostSpec("gpu1").local is False
    assert HostSpec("localhost", local=False).local is False  # explicit wins


@pytest.mark.parametrize(("items", "needle"), [
    ("gpu1:0", "'gpu1:0' has slots '0'"),
    ("gpu1:x", "'gpu1:x' has slots 'x'"),
    ("gpu1:", "has slots ''"),
    ("[::1", "'[::1' is not a valid host"),
    ("[::1]:-2", "has slots '-2'"),
    ("-oProxyCommand=evil", "not a hostname"),
    ("gpu 1", "not a hostname"),
    ("", "names no host"),
    (" , ", "names no host"),
])
def test_host_list_errors(items, needle):
    with pytest.raises(ConfigError, match="host") as info:
        parse_host_list(items)
    assert needle in str(info.value)


def test_host_list_duplicate_names_the_host():
    with pytest.raises(ConfigError, match=r"host 'GPU2' is listed twice \('gpu2:4' and 'GPU2'\)"):
        parse_host_list(["gpu1", "gpu2:4", "gpu3", "GPU2"])


def test_host_list_wrong_types():
    with pytest.raises(TypeError):
        parse_host_list(["gpu1", 3])
    with pytest.raises(TypeError):
        parse_host_list(7)


# ---------------------------------------------------------------------------------- hostfiles

HOSTFILE = """\
# the team's GPU boxes
gpu1 slots=8
gpu2 slots = 4   # slower NICs

10.0.0.3
[::1] slots=2
"""


def test_hostfile():
    assert parse_hostfile(HOSTFILE) == (HostSpec("gpu1", 8), HostSpec("gpu2", 4), HostSpec("10.0.0.3"),
                                        HostSpec("::1", 2, local=True))


@pytest.mark.parametrize(("text", "where", "line"), [
    ("gpu1 slots=8\ngpu2 slots=0\n", "hosts.txt:2", "gpu2 slots=0"),
    ("gpu1 slots=-1\n", "hosts.txt:1", "gpu1 slots=-1"),
    ("\n# c\ngpu1 slots=x\n", "hosts.txt:3", "gpu1 slots=x"),
    ("gpu1 slots=\n", "hosts.txt:1", "gpu1 slots="),
    ("gpu1 max_slots=8\n", "hosts.txt:1", "gpu1 max_slots=8"),
    ("gpu1 slots=8 extra\n", "hosts.txt:1", "gpu1 slots=8 extra"),
    ("ok\n-oProxyCommand=x\n", "hosts.txt:2", "-oProxyCommand=x"),
])
def test_hostfile_bad_lines_name_source_line_and_format(text, where, line):
    with pytest.raises(ConfigError) as info:
        parse_hostfile(text, source="hosts.txt")
    message = str(info.value)
    assert message.startswith(f"{where}: bad hostfile line {line!r}")
    assert "host slots=N" in message  # the expected format


def test_hostfile_host_colon_slots_gets_a_hint():
    with pytest.raises(ConfigError, match=r"hostfile:1: .*write 'gpu1 slots=8'"):
        parse_hostfile("gpu1:8\n")


def test_hostfile_duplicate_names_both_lines():
    with pytest.raises(ConfigError, match=r"hosts\.txt:4: host 'gpu1' is listed twice \(lines 2 and 4\)"):
        parse_hostfile("# x\ngpu1 slots=2\ngpu2\ngpu1 slots=4\n", source="hosts.txt")


def test_hostfile_without_hosts():
    with pytest.raises(ConfigError, match="hosts.txt lists no host"):
        parse_hostfile("# only a comment\n\n", source="hosts.txt")


def test_load_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("gpu1 slots=2\ngpu1\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: host 'gpu1' is listed twice"):
        cluster.load_hostfile(path)
    path.write_text(HOSTFILE)
    assert len(cluster.load_hostfile(str(path))) == 4
    with pytest.raises(ConfigError, match="cannot read the hostfile .*No such file"):
        cluster.load_hostfile(tmp_path / "missing")


# ---------------------------------------------------------------------------------- configs


def test_ssh_options_defaults_are_strict():
    options = SSHOptions()
    assert options.accept_new_host_keys is False and options.extra_options == ()
    assert options.connect_timeout_s == 10


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"port": 0}, "SSHOptions.port must be None or an int in 1..65535, got 0"),
    ({"port": 65536}, "got 65536"),
    ({"port": "22"}, "got '22'"),
    ({"port": True}, "got True"),
    ({"user": "-oProxyCommand=x"}, "SSHOptions.user"),
    ({"identity_file": "/nonexistent/id_ed25519"}, "SSHOptions.identity_file='/nonexistent/id_ed25519' "
                                                   "does not exist"),
    ({"extra_options": "ProxyJump=bastion"}, "must be a tuple of 'Key=Value' strings"),
    ({"extra_options": ("ProxyJump bastion",)},
     "'ProxyJump bastion'; each option must look like 'Key=Value'"),
    ({"extra_options": ("=x",)}, "must look like 'Key=Value'"),
    ({"extra_options": ("StrictHostKeyChecking=no",)}, "accept_new_host_keys=True"),
    ({"extra_options": ("batchmode=no",)}, "BatchMode=yes"),
    ({"extra_options": ("Port=2222",)}, "use port="),
    ({"connect_timeout_s": 0}, "SSHOptions.connect_timeout_s must be a number of seconds > 0, got 0"),
    ({"connect_timeout_s": float("inf")}, "got inf"),
    ({"known_hosts_file": "/nonexistent/known_hosts"}, "ssh-keyscan"),
    ({"accept_new_host_keys": "yes"}, "accept_new_host_keys must be True or False"),
])
def test_ssh_options_errors_name_field_value_and_fix(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        SSHOptions(**kwargs)
    assert needle in str(info.value)


def test_ssh_options_files(tmp_path):
    key = tmp_path / "id"
    key.write_text("not really a key")
    options = SSHOptions(identity_file=str(key), extra_options=["ProxyJump=bastion"],
                         known_hosts_file=str(tmp_path / "new_known_hosts"), accept_new_host_keys=True)
    assert options.identity_file == str(key) and options.extra_options == ("ProxyJump=bastion",)

def test_unreadable_identity_file(tmp_path, monkeypatch):
    key = tmp_path / "id"
    key.write_text("k")
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root could read a chmod 0 file
    with pytest.raises(ConfigError, match=r"SSHOptions.identity_file=.* is not readable .*chmod 600"):
        SSHOptions(identity_file=str(key))


def test_cluster_config_validation(tmp_path):
    hosts = (HostSpec("gpu1", 2), HostSpec("gpu2"))
    config_ = ClusterConfig(hosts=list(hosts), python="python3", workdir=str(tmp_path),
                            env_vars_to_forward=["WANDB_PROJECT"])
    assert config_.hosts == hosts and config_.ssh == SSHOptions()
    assert config_.env_vars_to_forward == ("WANDB_PROJECT",) and not config_.all_local
    assert config_.resolved_python() == "python3" and config_.resolved_workdir() == str(tmp_path)
    default = ClusterConfig(hosts=(HostSpec("localhost"),))
    assert default.all_local and default.resolved_python() == sys.executable
    assert default.resolved_workdir() == os.getcwd()
    for kwargs, needle in [
        ({"hosts": ()}, "ClusterConfig.hosts must be a non-empty tuple of HostSpec"),
        ({"hosts": ("gpu1",)}, "parse_host_list"),
        ({"hosts": (HostSpec("a"), HostSpec("A"))}, "host 'A' is listed twice"),
        ({"hosts": hosts, "python": "~/venv/bin/python"}, "ClusterConfig.python"),
        ({"hosts": hosts, "workdir": "relative/dir"}, "ClusterConfig.workdir must be None or an absolute"),
        ({"hosts": hosts, "env_vars_to_forward": "WANDB_PROJECT"}, "('WANDB_PROJECT',)"),
        ({"hosts": hosts, "env_vars_to_forward": ("BAD NAME",)}, "env_vars_to_forward"),
        ({"hosts": hosts, "ssh": {"port": 22}}, "ClusterConfig.ssh must be an SSHOptions"),
    ]:
        with pytest.raises(ConfigError) as info:
            ClusterConfig(**kwargs)
        assert needle in str(info.value), (kwargs, str(info.value))
    with pytest.raises(ConfigError, match="HostSpec.slots must be None or an int >= 1, got 0"):
        HostSpec("gpu1", 0)


# ---------------------------------------------------------------------------------- environment


def test_env_var_names_are_documented():
    assert (cluster.HOSTS_ENV_VAR, cluster.HOSTFILE_ENV_VAR) == (knobs.HOSTS.name, knobs.HOSTFILE.name)


def test_cluster_from_environment(tmp_path):
    assert cluster.cluster_from_environment({}) is None
    assert cluster.cluster_from_environment({"MINITRAIN_HOSTS": "  ", "MINITRAIN_HOSTFILE": ""}) is None
    from_hosts = cluster.cluster_from_environment({"MINITRAIN_HOSTS": "gpu1:2,gpu2:2"})
    assert from_hosts.hosts == (HostSpec("gpu1", 2), HostSpec("gpu2", 2))
    assert from_hosts.ssh == SSHOptions() and from_hosts.python is None
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu3 slots=4\n")
    from_file = cluster.cluster_from_environment({"MINITRAIN_HOSTFILE": str(hostfile)})
    assert from_file.hosts == (HostSpec("gpu3", 4),)
    with pytest.raises(ConfigError,
                       match="both MINITRAIN_HOSTS='gpu1' and MINITRAIN_HOSTFILE=.* set only one"):
        cluster.cluster_from_environment({"MINITRAIN_HOSTS": "gpu1", "MINITRAIN_HOSTFILE": str(hostfile)})
    with pytest.raises(ConfigError, match="MINITRAIN_HOSTS: host list: 'gpu1:0' has slots"):
        cluster.cluster_from_environment({"MINITRAIN_HOSTS": "gpu1:0"})


# ---------------------------------------------------------------------------------- init / current


def test_default_cluster_is_localhost(clean_cluster):
    assert cluster.current_cluster() == ClusterConfig(hosts=(HostSpec("localhost", None, local=True),))


def test_environment_is_used_without_init(clean_cluster, monkeypatch):
    monkeypatch.setenv("MINITRAIN_HOSTS", "gpu1:8,gpu2:8")
    assert [h.name for h in cluster.current_cluster().hosts] == ["gpu1", "gpu2"]


def test_init_wins_over_environment_until_shutdown(clean_cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRAIN_HOSTS", "envhost")
    key = tmp_path / "id"
    key.write_text("k")
    made = cluster.init(["gpu1:8", "gpu2:8"], ssh_user="ubuntu", ssh_port=2222, ssh_identity_file=str(key),
                        ssh_options=("ProxyJump=bastion",), accept_new_host_keys=True,
                        python="/opt/py/bin/python", env_vars_to_forward=("NCCL_SOCKET_IFNAME",),
                        workdir="/nfs/project")
    assert cluster.current_cluster() is made
    assert made.ssh == SSHOptions(user="ubuntu", port=2222, identity_file=str(key),
                                  extra_options=("ProxyJump=bastion",), accept_new_host_keys=True)
    assert made.python == "/opt/py/bin/python" and made.workdir == "/nfs/project"
    assert made.env_vars_to_forward == ("NCCL_SOCKET_IFNAME",)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu9 slots=1\n")
    again = cluster.init(hostfile=hostfile)  # a second init replaces the first
    assert cluster.current_cluster() is again and again.hosts == (HostSpec("gpu9", 1),)
    cluster.shutdown()
    assert [h.name for h in cluster.current_cluster().hosts] == ["envhost"]
    monkeypatch.delenv("MINITRAIN_HOSTS")
    assert cluster.current_cluster().all_local


def test_init_needs_exactly_one_source_and_changes_nothing_on_error(clean_cluster, tmp_path):
    with pytest.raises(ConfigError, match="exactly one of hosts=... or hostfile="):
        cluster.init()
    with pytest.raises(ConfigError, match="exactly one of hosts=... or hostfile="):
        cluster.init("gpu1", hostfile=str(tmp_path / "h"))
    made = cluster.init("gpu1")
    with pytest.raises(ConfigError, match="SSHOptions.port"):
        cluster.init("gpu2", ssh_port=0)
    assert cluster.current_cluster() is made


def test_only_an_agent_on_this_machine_is_given_the_coordinator_s_local_socket():
    from minitrain.hosts.launcher import ClusterLauncher

    config = ClusterConfig(hosts=(HostSpec("localhost", 2, local=True), HostSpec("gpu1", 2, local=False)),
                           python="python3")
    launcher = ClusterLauncher(config)
    local = launcher._argv(config.hosts[0], "10.0.0.1:5000", "run1", "local:/tmp/c/agents.sock")
    assert local == ["python3", "-m", "minitrain.agent", "--coordinator", "10.0.0.1:5000", "--node-id", "localhost",
                     "--run-id", "run1", "--local-stream", "local:/tmp/c/agents.sock"]
    assert "--local-stream" not in launcher._argv(config.hosts[0], "127.0.0.1:5000", "run1", "")
    remote = launcher._argv(config.hosts[1], "10.0.0.1:5000", "run1", "local:/tmp/c/agents.sock")
    assert "--local-stream" not in remote and not any("agents.sock" in part for part in remote)


def test_the_agent_refuses_a_local_stream_that_is_not_a_local_address(capsys):
    from minitrain.agent.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--coordinator", "127.0.0.1:1", "--run-id", "r", "--local-stream", "/tmp/agents.sock"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--local-stream '/tmp/agents.sock' is not local:<socket path>" in error
