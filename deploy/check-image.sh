#!/usr/bin/env bash
# Builds kvmem's image from deploy/Dockerfile with buildah, runs it with environment variables
# only (no config file), and checks what the image promises: /healthz answers and the image's
# own HEALTHCHECK passes, a write with the service key is stored, a request without it is
# 401, SQLite lives in the image's /data volume, owned by the image's non-root user, and
# every request is a line on stderr, and SIGTERM drains it (exit 0). Without a key, or with
# one that is too short, it refuses to start (exit 2) with a message naming the variable.
#
#   bash deploy/check-image.sh              # build, then check
#   bash deploy/check-image.sh --base-only  # only make the base image (see below)
#   bash deploy/check-image.sh --no-build   # check the image built last time
#
# Needs root (buildah's vfs storage and chroot isolation, a network namespace of its own).
# Installs buildah and debootstrap with apt-get when they are missing.
#
# The base: $KVMEM_BASE if set; else the Dockerfile's default (the official slim Python
# image) when a registry answers; else a Debian base made here with debootstrap from Debian's
# packages (python3, python3-venv, ca-certificates), kept in buildah's store for next time.
# The machine's CA bundle ($CA_BUNDLE) is mounted into the build only (-v), for pip behind a
# TLS-inspecting proxy; it is not in the image.
#
# Environment: KVMEM_IMAGE (default localhost/kvmem:check), KVMEM_BASE, CA_BUNDLE (default
# /etc/ssl/certs/ca-certificates.crt), DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${KVMEM_IMAGE:-localhost/kvmem:check}
SLIM_BASE=docker.io/library/python:3.12-slim
DEBIAN_BASE=localhost/kvmem-debian-base:bookworm
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BUILDAH=(buildah --storage-driver vfs)
WORK=$(mktemp -d /tmp/kvmem-image-check.XXXXXX)

say() { printf 'check-image: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

cleanup() {
    if [[ -n ${CONTAINER:-} ]]; then "${BUILDAH[@]}" rm "$CONTAINER" >/dev/null 2>&1 || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

install_tools() {
    if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
        say "installing buildah and debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null
    fi
}

image_exists() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# A minimal Debian with Python, made from Debian's packages, as a local image.
make_debian_base() {
    if image_exists "$DEBIAN_BASE"; then
        say "base: $DEBIAN_BASE (already made)"
        return
    fi
    say "making $DEBIAN_BASE with debootstrap from $DEBIAN_MIRROR"
    local rootfs=$WORK/rootfs
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap"; }
    # What an image never needs: downloaded packages, package lists, manuals, translations.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/*
    local container mountpoint
    container=$("${BUILDAH[@]}" from scratch)
    mountpoint=$("${BUILDAH[@]}" mount "$container")
    tar -C "$rootfs" -cf - . | tar -C "$mountpoint" -xf -
    "${BUILDAH[@]}" umount "$container" >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd '["python3"]' "$container"
    "${BUILDAH[@]}" commit --rm -q "$container" "$DEBIAN_BASE" >/dev/null
    rm -rf "$rootfs"
}

choose_base() {
    if [[ -n ${KVMEM_BASE:-} ]]; then
        BASE=$KVMEM_BASE
    elif image_exists "$SLIM_BASE" || timeout 60 "${BUILDAH[@]}" pull -q "$SLIM_BASE" >/dev/null 2>&1; then
        BASE=$SLIM_BASE
    else
        say "no registry answers for $SLIM_BASE: building from a Debian base instead"
        make_debian_base
        BASE=$DEBIAN_BASE
    fi
    say "base: $BASE"
}

build() {
    local started finished previous
    previous=$("${BUILDAH[@]}" images -q "$IMAGE" 2>/dev/null || true)
    started=$(date +%s)
    "${BUILDAH[@]}" bud --isolation chroot --format docker --layers=false \
        -f "$ROOT/deploy/Dockerfile" --build-arg BASE="$BASE" \
        --build-arg PIP_CERT=/run/kvmem-build/ca.crt -v "$CA_BUNDLE:/run/kvmem-build/ca.crt:ro" \
        -t "$IMAGE" "$ROOT" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; fail "build"; }
    finished=$(date +%s)
    BUILD_SECONDS=$((finished - started))
    # The image this one replaces under the same name, now untagged: not kept.
    if [[ -n $previous && $previous != "$("${BUILDAH[@]}" images -q "$IMAGE")" ]]; then
        "${BUILDAH[@]}" rmi "$previous" >/dev/null 2>&1 || true
    fi
    local base_bytes image_bytes
    base_bytes=$(image_bytes "$BASE")
    image_bytes=$(image_bytes "$IMAGE")
    IMAGE_MB=$((image_bytes / 1000000))
    say "built $IMAGE in ${BUILD_SECONDS} s: ${IMAGE_MB} MB unpacked (the base $BASE: $((base_bytes / 1000000)) MB, kvmem's layers: $(((image_bytes - base_bytes) / 1000000)) MB), $(($(compressed_bytes) / 1000000)) MB compressed"
}

# The image's size unpacked (what `docker images` shows), in bytes: its files' sizes.
image_bytes() {
    local container mountpoint
    container=$("${BUILDAH[@]}" from -q "$1")
    mountpoint=$("${BUILDAH[@]}" mount "$container")
    du -s --apparent-size -B1 "$mountpoint" | cut -f1
    "${BUILDAH[@]}" rm "$container" >/dev/null
}

# The image's size compressed (what a registry stores and a pull downloads), in bytes.
compressed_bytes() {
    "${BUILDAH[@]}" push -q "$IMAGE" "oci-archive:$WORK/image.tar" >/dev/null
    stat -c %s "$WORK/image.tar"
    rm "$WORK/image.tar"
}

# One field of the image's config, as JSON.
image_config() {
    "${BUILDAH[@]}" inspect --type image "$IMAGE" | python3 -c "
import json, sys
config = json.load(sys.stdin)['Docker']['config']
print(json.dumps(config.get('$1')))"
}

# The image's command, one word a line (ENTRYPOINT then CMD).
image_command() {
    "${BUILDAH[@]}" inspect --type image "$IMAGE" | python3 -c "
import json, sys
config = json.load(sys.stdin)['Docker']['config']
print('\n'.join((config.get('Entrypoint') or []) + (config.get('Cmd') or [])))"
}

# The HEALTHCHECK's command, one word a line.
healthcheck_command() {
    image_config Healthcheck | python3 -c "
import json, sys
test = json.load(sys.stdin)['Test']
assert test[0] in ('CMD', 'CMD-SHELL'), test
print('\n'.join(test[1:] if test[0] == 'CMD' else ['/bin/sh', '-c', test[1]]))"
}

# The processes under `$1`, children first.
descendants() {
    local child
    for child in $(pgrep -P "$1"); do
        echo "$child"
        descendants "$child"
    done
}

# Runs inside a network namespace of its own (see below): 0.0.0.0:8700 there is nobody else's.
check_running() {
    ip link set lo up
    local key data log command healthcheck
    key=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
    log=$WORK/serve.log
    mapfile -t command < <(image_command)
    mapfile -t healthcheck < <(healthcheck_command)
    local user
    user=$(image_config User | python3 -c 'import json, sys; print(json.load(sys.stdin) or "")')
    [[ -n $user && $user != root && $user != 0* ]] || fail "the image runs as root (USER is '$user')"

    say "a key that is too short is refused"
    local refused=0
    "${BUILDAH[@]}" run --isolation chroot --env KVMEM_SERVICE_KEY=short \
        "$CONTAINER" -- "${command[@]}" >"$WORK/refused.log" 2>&1 || refused=$?
    [[ $refused == 2 ]] || { cat "$WORK/refused.log" >&2; fail "a short key: exit $refused, not 2"; }
    grep -q "KVMEM_SERVICE_KEY" "$WORK/refused.log" || fail "the refusal does not name KVMEM_SERVICE_KEY"
    say "  $(grep -m1 KVMEM_SERVICE_KEY "$WORK/refused.log")"

    say "without a key it does not start (local mode never binds 0.0.0.0)"
    refused=0
    "${BUILDAH[@]}" run --isolation chroot "$CONTAINER" -- "${command[@]}" \
        >"$WORK/no-key.log" 2>&1 || refused=$?
    [[ $refused == 2 ]] || { cat "$WORK/no-key.log" >&2; fail "no key: exit $refused, not 2"; }
    grep -q "set KVMEM_SERVICE_KEY" "$WORK/no-key.log" || fail "the refusal does not say to set KVMEM_SERVICE_KEY"
    say "  $(grep -m1 KVMEM_SERVICE_KEY "$WORK/no-key.log")"

    say "serving with environment only: ${command[*]}"
    "${BUILDAH[@]}" run --isolation chroot \
        --env KVMEM_SERVICE_KEY="$key" --env KVMEM_CHAT_MODEL=openai/none \
        --env KVMEM_CHAT_API_BASE=http://127.0.0.1:9/v1 \
        "$CONTAINER" -- "${command[@]}" >"$WORK/stdout.log" 2>"$log" &
    local server=$! started ready
    started=$(date +%s.%N)
    for _ in $(seq 600); do
        if curl -fsS -o /dev/null http://127.0.0.1:8700/healthz 2>/dev/null; then break; fi
        kill -0 "$server" 2>/dev/null || { cat "$log" >&2; fail "the server exited"; }
        sleep 0.1
    done
    ready=$(python3 -c "import time; print(f'{time.time() - $started:.1f}')")
    curl -fsS http://127.0.0.1:8700/healthz >"$WORK/health.json" || { cat "$log" >&2; fail "/healthz"; }
    say "/healthz answered ${ready} s after start: $(cat "$WORK/health.json")"

    "${BUILDAH[@]}" run --isolation chroot "$CONTAINER" -- "${healthcheck[@]}" \
        || fail "the image's HEALTHCHECK (${healthcheck[*]}) failed"
    say "the image's HEALTHCHECK passes"

    local status
    status=$(curl -s -o "$WORK/put.json" -w '%{http_code}' -X PUT \
        http://127.0.0.1:8700/memory/image_check -H "Authorization: Bearer $key" \
        -H 'X-User-Id: alice' -H 'Content-Type: application/json' -d '{"value": "Written by check-image.sh"}')
    [[ $status == 201 ]] || { cat "$WORK/put.json" "$log" >&2; fail "PUT with the key: $status"; }
    status=$(curl -s -o "$WORK/get.json" -w '%{http_code}' http://127.0.0.1:8700/memory/image_check \
        -H "Authorization: Bearer $key" -H 'X-User-Id: alice')
    [[ $status == 200 ]] && grep -q "Written by check-image.sh" "$WORK/get.json" \
        || fail "GET with the key: $status $(cat "$WORK/get.json")"
    say "a write with the service key: 201, read back: 200"
    status=$(curl -s -o "$WORK/unauthorized.json" -w '%{http_code}' http://127.0.0.1:8700/memory \
        -H 'X-User-Id: alice')
    [[ $status == 401 ]] || fail "without the key: $status, not 401"
    status=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8700/memory \
        -H 'Authorization: Bearer not-the-key' -H 'X-User-Id: alice')
    [[ $status == 401 ]] || fail "with a wrong key: $status, not 401"
    say "without the key, or with a wrong one: 401 $(cat "$WORK/unauthorized.json")"

    # The image's VOLUME /data: buildah gives the container a directory of its own for it,
    # made from the image's /data (its owner and mode).
    local id
    id=$("${BUILDAH[@]}" inspect --type container --format '{{.ContainerID}}' "$CONTAINER")
    data=$(echo "$("${BUILDAH[@]}" info --format '{{.store.GraphRoot}}')"/vfs-containers/"$id"/userdata/buildah-volumes/*)
    [[ -d $data ]] || fail "no volume for /data: $data"
    [[ $(stat -c '%u %a' "$data") == "10001 700" ]] || fail "/data is not the kvmem user's alone: $(stat -c '%u %a' "$data")"
    [[ -f $data/kvmem.db ]] || fail "no SQLite database under /data: $(ls -la "$data")"
    [[ $(stat -c %u "$data/kvmem.db") == 10001 ]] || fail "/data/kvmem.db is not the kvmem user's"
    python3 - "$data/kvmem.db" <<'EOF' || fail "the write is not in /data/kvmem.db"
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute(
    "SELECT user_id, key FROM memory_entries WHERE key = 'image_check'").fetchall()
assert rows == [("alice", "image_check")], rows
EOF
    say "SQLite under /data (the image's volume, uid 10001, mode 700): kvmem.db, $(stat -c '%s bytes, uid %u' "$data/kvmem.db"), holds the write"

    # SIGTERM to kvmem itself (buildah run would SIGKILL it): it drains and exits 0.
    local pid served=""
    for pid in $(descendants "$server"); do
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "kvmem serve"; then served=$pid; fi
    done
    [[ -n $served ]] || fail "no kvmem serve process under buildah run"
    kill -TERM "$served"
    local stopped=0
    wait "$server" || stopped=$?
    [[ $stopped == 0 ]] || { cat "$log" >&2; fail "kvmem exited $stopped on SIGTERM, not 0"; }
    grep -q "Finished server process" "$log" || fail "no drained shutdown in the log"
    say "SIGTERM: drained, exit 0"
    grep -q '"PUT /memory/image_check" 201' "$log" || { cat "$log" >&2; fail "no request line for the PUT"; }
    grep -q '"GET /memory" 401' "$log" || { cat "$log" >&2; fail "no request line for the 401"; }
    say "the request log (stderr):"
    sed 's/^/    /' "$log" >&2
}

install_tools
if [[ ${1:-} == --base-only ]]; then
    make_debian_base
    exit 0
fi
choose_base
if [[ ${1:-} == --no-build ]] && image_exists "$IMAGE"; then
    BUILD_SECONDS="(not rebuilt)"
    IMAGE_MB=$(($(image_bytes "$IMAGE") / 1000000))
else
    build
fi
CONTAINER=$("${BUILDAH[@]}" from -q "$IMAGE")
export -f check_running say fail image_config image_command healthcheck_command descendants
export IMAGE WORK CONTAINER
export BUILDAH_ARGS="${BUILDAH[*]}"
unshare --net --fork bash -c 'BUILDAH=($BUILDAH_ARGS); check_running'
say "passed: build ${BUILD_SECONDS} s, image ${IMAGE_MB} MB unpacked, on $BASE"
