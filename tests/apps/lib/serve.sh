# Sourced by the app tests that need a server: `start_serve TROUPE TMP ARGS...` runs `troupe serve ARGS
# --host 127.0.0.1 --port 0` in the background, waits for its address line and sets $server (the pid)
# and $base (http://127.0.0.1:PORT). The caller kills $server in its cleanup.
start_serve() {
  local troupe="$1" tmp="$2"
  shift 2
  "$troupe" serve "$@" --host 127.0.0.1 --port 0 > "$tmp/serve.out" 2> "$tmp/serve.err" &
  server=$!
  for _ in $(seq 1 300); do
    grep -q "troupe serve: http://" "$tmp/serve.out" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$tmp/serve.err"; return 1; }
    sleep 0.1
  done
  base="$(grep -o 'http://[0-9.:]*' "$tmp/serve.out" | head -1)"
  [ -n "$base" ] || { cat "$tmp/serve.err"; return 1; }
}
