"""One user floods the daemon with admissions; what do the others get?

    python bench/admission_flood.py [--seconds 20] [--flooders 4]

Must run as root (the flooder and the other user are other uids). Starts a
private daemon over the simulated GPU (2x16G, the default config) whose
socket every user may reach, then for --seconds:

- the flooder, uid 65534, in --flooders processes, asks for a job of
  --flood-mem MiB (8) again and again on one connection each and never
  starts one (a launcher that holds its reservations and does nothing);
- root runs `vgpuctl ps --json` every 0.5 s: its wall time;
- another user, uid 65533, asks for a 1 GiB job every second, as `vgpuctl
  run` does (asking again when told to), and ends it: the time from its
  request to its admission.

Targets (issue 19): root's `ps` under 0.5 s, the other user admitted within
1 s. Also: how many of the flooder's requests were admitted, and the
database's growth. Writes bench/results/admission_flood.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from run_overhead import remove_regions, start_daemon, vgpuctl_argv  # noqa: E402

from vgpuctl.client.connection import Client  # noqa: E402

FLOODER, OTHER = 65534, 65533
G = 1 << 30


def as_uid(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def flood(sock: Path, seconds: float, mem: int, out: int) -> None:
    """In a forked child: ask, ask, ask; write "admitted refused" to out."""
    as_uid(FLOODER)
    admitted = refused = 0
    end = time.monotonic() + seconds
    c = None
    while time.monotonic() < end:
        try:
            if c is None:
                c = Client.connect(sock, timeout=5)
            reply = c._exchange(json.dumps({"v": 1, "op": "run", "command": ["hold"],
                                            "cwd": "/", "mem": mem}).encode() + b"\n")
            if reply.get("ok"):
                admitted += 1
            else:
                refused += 1
        except Exception:  # noqa: BLE001 - a closed connection: open another
            if c is not None:
                c.close()
            c = None
    os.write(out, f"{admitted} {refused}\n".encode())
    os._exit(0)


def other_user(sock: Path, out: int) -> None:
    """In a forked child: one job as `vgpuctl run` asks for it (the client
    asks again when told to), ended at once; writes the seconds it took."""
    as_uid(OTHER)
    t0 = time.monotonic()
    try:
        with Client.connect(sock, timeout=30) as c:
            job = c.call("run", command=["true"], cwd="/", mem=G)["job"]
            took = time.monotonic() - t0
            c.call("exited", job=job["id"], code=0)
        os.write(out, f"{took}\n".encode())
    except Exception as e:  # noqa: BLE001
        os.write(out, f"error {type(e).__name__}: {e}\n".encode())
    os._exit(0)


def forked(fn, *args) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn(*args, w)
        finally:
            os._exit(1)
    os.close(w)
    return pid, r


def read_all(fd: int) -> str:
    out = b""
    while chunk := os.read(fd, 4096):
        out += chunk
    os.close(fd)
    return out.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--flooders", type=int, default=4)
    ap.add_argument("--flood-mem", type=int, default=8, metavar="MIB")
    ap.add_argument("--out", default=str(HERE / "results" / "admission_flood.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the flooder and the other user are other uids")
    base = Path(tempfile.mkdtemp(prefix="vgpu-flood-"))
    os.chmod(base, 0o755)
    daemon, env = start_daemon(base, bytecode_cache=False)
    sock = base / "vgpud.sock"
    db = base / "state" / "vgpu.db"
    try:
        size0 = db.stat().st_size
        floods = [forked(flood, sock, args.seconds, args.flood_mem << 20)
                  for _ in range(args.flooders)]
        time.sleep(1.0)                     # the flood is on
        ps_s, other_s, errors = [], [], []
        end = time.monotonic() + args.seconds - 2.0
        next_other = time.monotonic()
        while time.monotonic() < end:
            t0 = time.monotonic()
            subprocess.run([*vgpuctl_argv(), "ps", "--json"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            ps_s.append(time.monotonic() - t0)
            if time.monotonic() >= next_other:
                pid, fd = forked(other_user, sock)
                text = read_all(fd).strip()
                os.waitpid(pid, 0)
                if text.startswith("error"):
                    errors.append(text)
                else:
                    other_s.append(float(text))
                next_other = time.monotonic() + 1.0
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
        admitted = refused = 0
        for pid, fd in floods:
            a, r = read_all(fd).split()
            os.waitpid(pid, 0)
            admitted, refused = admitted + int(a), refused + int(r)
        size1 = db.stat().st_size
        wal = db.with_name(db.name + "-wal")
        size1 += wal.stat().st_size if wal.exists() else 0
    finally:
        daemon.terminate()
        daemon.wait(30)
        remove_regions(base / "run")
    res = {
        "machine": platform.node(), "cpus": os.cpu_count(), "seconds": args.seconds,
        "flooders": args.flooders, "flood_mem_mib": args.flood_mem,
        "flood_requests": admitted + refused, "flood_admitted": admitted,
        "ps_s_median": statistics.median(ps_s), "ps_s_max": max(ps_s), "ps_runs": len(ps_s),
        "other_admitted_s_median": statistics.median(other_s) if other_s else None,
        "other_admitted_s_max": max(other_s) if other_s else None,
        "other_tries": len(other_s) + len(errors), "other_refused": errors[:5],
        "other_refusals": len(errors),
        "db_growth_bytes": size1 - size0,
    }
    print(f"flood: {res['flood_requests']} requests in {args.seconds:.0f} s, "
          f"{admitted} admitted")
    print(f"root's ps --json: median {res['ps_s_median']:.3f} s, max {res['ps_s_max']:.3f} s "
          f"({len(ps_s)} runs)")
    if other_s:
        print(f"other user admitted: median {res['other_admitted_s_median']:.3f} s, "
              f"max {res['other_admitted_s_max']:.3f} s ({len(other_s)} of "
              f"{res['other_tries']})")
    for e in errors[:3]:
        print(f"other user refused: {e}")
    print(f"database growth: {res['db_growth_bytes'] / 1e6:.1f} MB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
