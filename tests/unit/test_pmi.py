"""hpvc's PMI-1 server for MPICH ranks (``hpvc.cluster.pmi``): the process
mapping that makes co-resident nodes one host, and the wire protocol as
MPICH 4.0.2's simple PMI client speaks it (``src/pmi/simple/simple_pmi.c``)."""

from __future__ import annotations

import dataclasses
import socket
import threading

from hpvc.cluster import pmi
from tests.unit.test_render import make_node


def test_co_resident_nodes_are_one_node_of_the_mapping() -> None:
    a, b = make_node("compute0", 0), make_node("compute1", 1)
    assert a.host == b.host
    assert pmi.process_mapping([(a, 1), (b, 1)]) == "(vector,(0,1,2))"
    assert pmi.process_mapping([(a, 2), (b, 3)]) == "(vector,(0,1,5))"


def test_nodes_on_other_hosts_are_nodes_of_their_own() -> None:
    a, b = make_node("compute0", 0), make_node("compute1", 1)
    c = dataclasses.replace(make_node("compute2", 2), host="hostB")
    assert pmi.process_mapping([(a, 1), (c, 2), (b, 1)]) == "(vector,(0,1,1),(1,1,2),(0,1,1))"


def talk(port: int, rank: int, out: dict[int, list[str]]) -> None:
    """What an MPICH rank says through MPI_Init and MPI_Finalize, in order."""
    with socket.create_connection(("127.0.0.1", port)) as s, s.makefile("r") as f:

        def ask(line: str) -> str:
            s.sendall(line.encode())
            return f.readline().strip()

        got = [
            ask("cmd=init pmi_version=1 pmi_subversion=1\n"),
            ask("cmd=get_maxes\n"),
            ask("cmd=get_appnum\n"),
            ask("cmd=get_my_kvsname\n"),
            ask("cmd=get kvsname=k key=PMI_process_mapping\n"),
            ask(f"cmd=put kvsname=k key=addr{rank} value=v{rank}\n"),
            ask("cmd=barrier_in\n"),  # both ranks' puts are in before either goes on
            ask(f"cmd=get kvsname=k key=addr{1 - rank}\n"),
            ask("cmd=get kvsname=k key=missing\n"),
            ask("cmd=finalize\n"),
        ]
        out[rank] = got


def test_two_ranks_init_exchange_and_finalize() -> None:
    server = pmi.Server("127.0.0.1", 2, "(vector,(0,1,2))")
    out: dict[int, list[str]] = {}
    threads = [threading.Thread(target=talk, args=(server.port, r, out)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    server.close()
    assert set(out) == {0, 1}
    r0 = out[0]
    assert r0[0] == "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
    assert r0[1] == "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024"
    assert r0[2] == "cmd=appnum appnum=0"
    assert r0[3].startswith("cmd=my_kvsname kvsname=hpvc_")
    assert r0[4] == "cmd=get_result rc=0 msg=success value=(vector,(0,1,2))"
    assert r0[5] == "cmd=put_result rc=0 msg=success"
    assert r0[6] == "cmd=barrier_out"
    assert r0[7] == "cmd=get_result rc=0 msg=success value=v1"
    assert out[1][7] == "cmd=get_result rc=0 msg=success value=v0"
    assert r0[8].startswith("cmd=get_result rc=-1")
    assert r0[9] == "cmd=finalize_ack"


def test_abort_is_the_jobs_exit_code() -> None:
    server = pmi.Server("127.0.0.1", 1, "(vector,(0,1,1))")
    assert server.answer({"cmd": "abort", "exitcode": "7"}) is None
    assert server.abort == 7
    assert "rc=-1" in (server.answer({"cmd": "lookup_name"}) or "")
    server.close()


def test_only_the_nodes_addresses_may_connect() -> None:
    """A connection from an address that is no node's (another user of the host,
    reaching the bridge's address) is closed unanswered; a node's is served."""
    server = pmi.Server("127.0.0.1", 1, "(vector,(0,1,1))", frozenset({"127.0.0.2"}))
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            try:
                s.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\n")
                said = s.recv(100)
            except ConnectionResetError:  # closed with the line unread
                said = b""
            assert said == b""  # closed, nothing said
        with socket.create_connection(
            ("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.2", 0)
        ) as s:
            s.sendall(b"cmd=get_appnum\n")
            assert s.recv(100) == b"cmd=appnum appnum=0\n"
    finally:
        server.close()
