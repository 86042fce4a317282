"""The agent's PMIx and PMI-2 channels without a VM (native/agent/chan.c,
pmixhs.c; docs/slurm.md, "MPI between guests").

In a network namespace this test makes (loopback only), native/agent's server
plays the guest's agent and the test driver the task relay (connects as root
from a reserved port, proves the key, then runs as an ordinary uid, as
slurmstepd's task does). A stand-in for Slurm's PMIx server on the
namespace's 127.0.0.1 records each connection request it gets; the "guest"
command is a PMIx client written here, which sends the request PMIx 4.2's
client sends (its security module, its claimed uid and gid, root's in a
guest, its namespace and rank). The server must see the relay's uid and gid
for this task's namespace and rank, and nothing of a request for another
rank, another security module, a tool, or bytes that are no request; the
command's PMI_FD must reach the relay's own PMI_FD.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_driver import build
from tests.helpers import requires

IP = "10.231.78.1"
NOBODY = 65534

# The PMIx client in the "guest": a connection request as PMIx 4.2 builds it
# (header: int32 index, uint32 tag, size_t length, host order; then the
# module, the credential's length in network order and the uid, gid; the
# process kind; namespace and rank; version, buffer module and type, gds).
CLIENT = r"""
import os, socket, struct, sys
kind = sys.argv[1]
if kind == "pmi":
    fd = int(os.environ["PMI_FD"])
    s = socket.socket(fileno=fd)
    s.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\n")
    print("pmi", s.recv(200).decode().strip(), flush=True)
    sys.exit(0)
uri = os.environ["PMIX_SERVER_URI41"]
port = int(uri.rsplit(":", 1)[1])
ns, rank, sec, flag = os.environ["PMIX_NAMESPACE"], int(os.environ["PMIX_RANK"]), "native", 0
if kind == "rank":
    rank += 1
if kind == "sec":
    sec = "none"
if kind == "tool":
    flag = 3
body = sec.encode() + b"\0" + struct.pack("!I", 8) + struct.pack("<II", 0, 0)
body += bytes([flag]) + ns.encode() + b"\0" + struct.pack("!I", rank)
body += b"4.2.2\0v41\0" + bytes([2]) + b"hash\0"
msg = struct.pack("<iIQ", -1, 0xFFFFFFFF, len(body)) + body
if kind == "junk":
    msg = b"GET / HTTP/1.0\r\nHost: x\r\n\r\n"
c = socket.create_connection(("127.0.0.1", port), timeout=20)
c.sendall(msg)
got = b""
while True:
    b = c.recv(4096)
    if not b:
        break
    got += b
print("port", port, "answer", got.decode() or "-", flush=True)
"""

# The stand-in server, then one relay per case (each a task of its own), in
# the namespace; what each saw and said as JSON.
SCENARIO = r"""
import json, os, socket, struct, subprocess, sys, threading, time
drv, tmp, ip, uid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", ip + "/24", "dev", "lo"], check=True)
seen = []
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
port = srv.getsockname()[1]

def serve():
    while True:
        c, _ = srv.accept()
        data = b""
        c.settimeout(5)
        try:
            while len(data) < 16 or len(data) < 16 + struct.unpack("<Q", data[8:16])[0]:
                b = c.recv(4096)
                if not b:
                    break
                data += b
        except OSError:
            pass
        if len(data) < 16:
            seen.append({"bytes": len(data)})
            c.close()
            continue
        body = data[16:]
        sec, rest = body.split(b"\0", 1)
        uid_, gid_ = struct.unpack("<II", rest[4:12])
        ns, rest2 = rest[13:].split(b"\0", 1)
        rank = struct.unpack("!I", rest2[:4])[0]
        seen.append(
            {"sec": sec.decode(), "uid": uid_, "gid": gid_, "ns": ns.decode(), "rank": rank}
        )
        c.sendall(f"welcome {ns.decode()}.{rank} as {uid_}:{gid_}".encode())
        c.close()

threading.Thread(target=serve, daemon=True).start()
agent = subprocess.Popen(
    [drv, "serve", ip + "/24", tmp + "/key"], stdout=subprocess.PIPE, text=True
)
pid = int(agent.stdout.readline().split()[1])
time.sleep(0.1)
env = dict(os.environ, PMIX_SERVER_URI41=f"job.7;tcp4://127.0.0.1:{port}",
           PMIX_SERVER_URI4=f"job.7;tcp4://127.0.0.1:{port}", PMIX_NAMESPACE="job.7", PMIX_RANK="1")
out = {"server_port": port, "cases": {}}
relay = [drv, "chan", ip, tmp + "/key", str(uid), sys.executable, tmp + "/client.py"]
for kind in ("good", "rank", "sec", "tool", "junk"):
    r = subprocess.run([*relay, kind], env=env, capture_output=True, text=True, timeout=60)
    out["cases"][kind] = [r.returncode, r.stdout, r.stderr]
# PMI-2: the relay's PMI_FD, answered here.
a, b = socket.socketpair()
env2 = {k: v for k, v in os.environ.items()}
env2["PMI_FD"] = str(b.fileno())
p = subprocess.Popen(
    [*relay, "pmi"], env=env2, pass_fds=[b.fileno()],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
)
b.close()
a.settimeout(30)
asked = a.recv(200).decode().strip()
a.sendall(b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n")
so, se = p.communicate(timeout=60)
out["pmi"] = [p.returncode, asked, so, se]
time.sleep(0.2)
out["seen"] = seen
os.kill(pid, 9)
agent.kill()
agent.wait()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requires("root")
    return build(tmp_path_factory.mktemp("agent-build"))


def test_the_relay_carries_only_its_tasks_pmix_request_made_its_own(
    driver: Path, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)  # the relay, once an ordinary uid, runs from here
    fd = os.open(tmp_path / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    (tmp_path / "client.py").write_text(CLIENT)
    (tmp_path / "scenario.py").write_text(SCENARIO)
    argv = [sys.executable, str(tmp_path / "scenario.py"), str(driver), str(tmp_path), IP]
    r = subprocess.run(
        ["unshare", "--net", "--fork", "--kill-child", *argv, str(NOBODY)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    cases = out["cases"]
    # The task's own request: the server saw the relay's ids, not the guest's root.
    rc, said, err = cases["good"]
    assert rc == 0, (said, err)
    assert f"answer welcome job.7.1 as {NOBODY}:{NOBODY}" in said, (said, err)
    # The command was pointed at the agent's own listener, not the host's port.
    assert f"port {out['server_port']} " not in said, said
    for kind, why in (
        ("rank", "another namespace or rank than this task's"),
        ("sec", "only PMIx's native security is carried"),
        ("tool", "only an MPI rank (a simple PMIx client) is carried"),
        ("junk", "not a PMIx connection request"),
    ):
        rc, said, err = cases[kind]
        assert rc == 0 and "answer -" in said, (kind, said, err)  # nothing came back
        assert "PMIx channel from the guest refused: " in err and why in err, (kind, err)
    # The server got exactly one request: the good one, made the relay's.
    requests = [s for s in out["seen"] if "ns" in s]
    assert requests == [
        {"sec": "native", "uid": NOBODY, "gid": NOBODY, "ns": "job.7", "rank": 1}
    ], out["seen"]
    rc, asked, said, err = out["pmi"]
    assert asked == "cmd=init pmi_version=1 pmi_subversion=1", (asked, err)
    assert rc == 0 and "pmi cmd=response_to_init" in said and "rc=0" in said, (said, err)
