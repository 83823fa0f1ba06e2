#!/usr/bin/env python3
"""Issue 19's probes, from outside, as an attacker on the same network would (loopback only).

    bench/security_probes.py build/release/apps/troupe [--seconds S]

Starts `troupe sim` (mutual TLS, a throw-away CA) and `troupe serve` on the embedded model, then runs
each probe against them while a legitimate client keeps asking: the coordinator's RSS before and after
and a legitimate job's latency (troupe submit), the gateway's RSS and its /health latency. Prints a
Markdown table (bench/results/security-probes.md holds a run).
"""
import json, os, re, resource, signal, socket, subprocess, sys, tempfile, threading, time

troupe = os.path.abspath(sys.argv[1])
seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 20.0
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
work = tempfile.mkdtemp(prefix="troupe-probes-")
rows = []


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def mb(b):
    return f"{b / 1e6:.1f} MB"


# ---- the cluster -------------------------------------------------------------------------------------
fifo = os.path.join(work, "cmd")
os.mkfifo(fifo)
out = open(os.path.join(work, "sim.out"), "w")
sim = subprocess.Popen([troupe, "sim", "--nodes", "2", "--dir", os.path.join(work, "sim")], stdin=subprocess.PIPE, stdout=out, stderr=out)
for _ in range(600):
    text = open(os.path.join(work, "sim.out")).read()
    if "deployed on" in text:
        break
    time.sleep(0.1)
port = int(re.search(r"coordinator 127\.0\.0\.1:(\d+)", text).group(1))
cfile = os.path.join(work, "sim", "cluster.toml")
cpid = int(subprocess.check_output(["pgrep", "-f", f"coordinator --listen 127.0.0.1:0 --secret-file {work}"]).split()[0])


def legit_job():
    t0 = time.time()
    r = subprocess.run([troupe, "submit", "--cluster-file", cfile, "--prompt-ids", "5,6,7", "--max-tokens", "8", "--json"], capture_output=True, text=True, timeout=60)
    return time.time() - t0, r.returncode == 0 and '"tokens"' in r.stdout


def basp(op, claimed, dest=7, payload=b""):
    h = bytes([op, 0, 0, 0]) + claimed.to_bytes(4, "big") + bytes(16) + dest.to_bytes(8, "big")
    return h + payload


def cluster_probe(name, action):
    base_rss = rss(cpid)
    base_lat, ok0 = legit_job()
    t0 = time.time()
    detail = action()
    lat, ok = legit_job()
    after = rss(cpid)
    rows.append(("coordinator", name, f"{time.time() - t0:.1f} s", detail, f"{base_lat:.2f} s -> {lat:.2f} s" + ("" if ok and ok0 else " (FAILED)"),
                 f"{mb(base_rss)} -> {mb(after)} ({(after - base_rss) / 1e6:+.1f} MB)"))


def forged_job():
    got = 0
    for actor in range(1, 20):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(basp(1, 0) + basp(2, 4, actor, b"job!"))
        s.settimeout(3)
        try:
            while s.recv(4096):
                got += 1
        except OSError:
            pass
        s.close()
    return f"19 forged jobs (actor ids 1-19): {got} reads answered"


def four_gib():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(basp(2, 0xFFFFFFF0))
    s.settimeout(6)
    try:
        s.recv(1)
    except OSError:
        pass
    s.close()
    return "one 32-byte header claiming 4 GiB, unauthenticated"


def flood():
    stop = time.time() + seconds
    n = 0
    while time.time() < stop:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(b"\x16\x03\x01\x00\x05hello")  # a TLS record that never becomes a handshake
            s.close()
            n += 1
        except OSError:
            pass
    return f"{n} connections in {seconds:.0f} s"


HOLDER = """
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
socks = []
for _ in range(int(sys.argv[2])):
    try:
        socks.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1))
    except OSError:
        pass
print(len(socks), flush=True)
time.sleep(float(sys.argv[3]))
"""


def silent():
    # Two helper processes of 10,000 connections each (one process may hold at most 20,000 files).
    helpers = [subprocess.Popen([sys.executable, "-c", HOLDER, str(port), "10000", "8"], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    held = sum(int(h.stdout.readline() or 0) for h in helpers)
    lat, ok = legit_job()
    for h in helpers:
        h.wait()
    return f"{held} silent connections opened (a job meanwhile: {lat:.2f} s{'' if ok else ', FAILED'})"


cluster_probe("forged job, no certificate", forged_job)
cluster_probe("4 GiB length header", four_gib)
cluster_probe("connection/handshake flood", flood)
cluster_probe("20,000 silent connections", silent)
log = open(os.path.join(work, "sim", "coordinator.log")).read()
refusals = len(re.findall("event=link_refused", log))
sim.stdin.write(b"quit\n")
sim.stdin.flush()
sim.wait(timeout=30)

# ---- the gateway -------------------------------------------------------------------------------------
gport_file = os.path.join(work, "serve.out")
serve = subprocess.Popen([troupe, "serve", "--port", "0", "--capacity", "256"], stdout=open(gport_file, "w"), stderr=subprocess.STDOUT)
for _ in range(600):
    m = re.search(r"127\.0\.0\.1:(\d+)", open(gport_file).read())
    if m:
        break
    time.sleep(0.1)
gport = int(m.group(1))
time.sleep(1)


def health_latency():
    t0 = time.time()
    try:
        s = socket.create_connection(("127.0.0.1", gport), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = s.recv(100)
        s.close()
        return time.time() - t0, data.startswith(b"HTTP/1.1 200")
    except OSError:
        return time.time() - t0, False


def request(raw, read=True):
    s = socket.create_connection(("127.0.0.1", gport), timeout=30)
    try:
        s.sendall(raw)
    except OSError:
        pass
    status = ""
    if read:
        try:
            status = s.recv(64).split(b"\r\n")[0].decode(errors="replace")
        except OSError as e:
            status = f"({e.__class__.__name__})"
    s.close()
    return status


def gateway_probe(name, action):
    base = rss(serve.pid)
    worst = [0.0]
    bad = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            lat, ok = health_latency()
            worst[0] = max(worst[0], lat)
            bad[0] += not ok
            time.sleep(0.2)

    t = threading.Thread(target=watch)
    t.start()
    t0 = time.time()
    detail = action()
    stop.set()
    t.join()
    after = rss(serve.pid)
    alive = serve.poll() is None
    print(name, file=sys.stderr, flush=True)
    rows.append(("gateway", name, f"{time.time() - t0:.1f} s", detail, f"/health worst {worst[0]:.3f} s, {bad[0]} failed" + ("" if alive else ", CRASHED"),
                 f"{mb(base)} -> {mb(after)} ({(after - base) / 1e6:+.1f} MB)"))


def body(b, path="/v1/chat/completions"):
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b


def nested_tools():
    b = b'{"model":"troupe-kjv","messages":[{"role":"user","content":"hi"}],"tools":' + b"[" * 80000 + b"]" * 80000 + b"}"
    return request(body(b))


def chunked():
    s = socket.create_connection(("127.0.0.1", gport), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent = 0
    chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"
    try:
        while sent < 250 << 20:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    s.close()
    return f"{sent >> 20} MiB sent before the close"


def many_headers():
    s = socket.create_connection(("127.0.0.1", gport), timeout=30)
    sent = 0
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        line = b"X-A: b\r\n" * 10000
        for _ in range(300):  # 3M headers
            s.sendall(line)
            sent += 10000
    except OSError:
        pass
    try:
        status = s.recv(64).split(b"\r\n")[0].decode()
    except OSError:
        status = "(closed)"
    s.close()
    return f"{sent} headers sent: {status}"


def nested_bodies():
    b = b'{"model":"troupe-kjv","prompt":' + b"[" * (2 << 20) + b"]" * (2 << 20) + b"}"
    res = []
    ts = [threading.Thread(target=lambda: res.append(request(body(b, "/v1/completions")))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return "8 x 4 MiB: " + ", ".join(sorted(set(res)))


def completion():
    b = json.dumps({"model": "troupe-kjv", "prompt": "In the beginning", "max_tokens": 4}).encode()
    t0 = time.time()
    status = request(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(b)).encode() + b"\r\n\r\n" + b)
    return time.time() - t0, status


def slowloris():
    # 130 connections kept open (one closed by the gateway is opened again), each sending a byte a
    # second of a request head that never ends; a completion is asked in the middle.
    stop = time.time() + seconds
    socks = [socket.create_connection(("127.0.0.1", gport)) for _ in range(130)]
    closed, opened, done = 0, 130, None
    while time.time() < stop:
        for i, s in enumerate(socks):
            try:
                s.send(b"X")
            except OSError:
                s.close()
                closed += 1
                try:
                    socks[i] = socket.create_connection(("127.0.0.1", gport), timeout=2)
                    opened += 1
                except OSError:
                    pass
        if done is None and time.time() > stop - seconds / 2:
            done = completion()
        time.sleep(1)
    for s in socks:
        s.close()
    lat, status = done or (0.0, "not asked")
    return f"130 held open, a byte a second ({opened} opened, {closed} closed by the gateway); a completion meanwhile: {status} in {lat:.2f} s"


def ranged():
    return request(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0," + b"0-0," * 2000 + b"0-0\r\n\r\n")


def unknown_paths():
    # Pipelined on keep-alive connections, 500 at a time.
    done = 0
    while done < 20000:
        s = socket.create_connection(("127.0.0.1", gport), timeout=30)
        batch = b"".join(f"GET /x{done + i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(500))
        s.sendall(batch)
        seen, buf = 0, b""
        try:
            while seen < 500:
                d = s.recv(1 << 16)
                if not d:
                    break
                buf += d
                seen = buf.count(b"HTTP/1.1 ")
        except OSError:
            pass
        s.close()
        done += 500
    return "20,000 paths"


def injection():
    request(b"GET /a%22%7D%0Atroupe_running_sequences%20999 HTTP/1.1\r\nHost: x\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", gport), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            text += d
    except OSError:
        pass
    s.close()
    series = len([l for l in text.decode(errors="replace").splitlines() if l.startswith("troupe_http_requests_total")])
    return f"forged line present: {'troupe_running_sequences 999' in text.decode(errors='replace')}; request series: {series}"


gateway_probe("nested tools (80,000 levels)", nested_tools)
gateway_probe("chunked 250 MiB", chunked)
gateway_probe("3M headers", many_headers)
gateway_probe("8 concurrent nested 4 MiB bodies", nested_bodies)
gateway_probe(f"130-connection slowloris, {seconds:.0f} s", slowloris)
gateway_probe("Range amplification", ranged)
gateway_probe("20,000 unknown paths", unknown_paths)
gateway_probe("metrics injection", injection)
serve.send_signal(signal.SIGTERM)
serve.wait(timeout=30)

print("| target | probe | took | what it did | legitimate traffic | RSS |")
print("|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print(f"\ncoordinator log: {refusals} `event=link_refused` lines (rate-limited to one a second per reason)")
