#!/usr/bin/env bash
# Best-effort start of the services the integration tests use on this machine:
#   PostgreSQL on 127.0.0.1:5432 (trust auth for user postgres over TCP from 127.0.0.1),
#   Redis on 127.0.0.1:6379, and the test database (default dprelease_test).
# Installs them with apt-get when they are missing (root only). Idempotent: running it again
# when everything is up changes nothing. Everything it does is reported on stderr.
# DPRELEASE_SKIP_SERVICES=1 makes it a no-op (services managed elsewhere, e.g. containers).
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=5432
PG_USER=postgres
PG_CLUSTER=main
PG_ETC=/etc/postgresql
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
WAIT_SECONDS=30
HBA_MARKER="# added by dprelease scripts/ensure_services.sh"

log() { printf 'ensure_services: %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
is_root() { [ "$(id -u)" -eq 0 ]; }

if [ "${DPRELEASE_SKIP_SERVICES:-0}" = "1" ]; then
    log "DPRELEASE_SKIP_SERVICES=1: not checking or starting any service"
    exit 0
fi

# The test database: the last path segment of DPRELEASE_TEST_DATABASE_URL when set.
TEST_DB=dprelease_test
if [ -n "${DPRELEASE_TEST_DATABASE_URL:-}" ]; then
    _db="${DPRELEASE_TEST_DATABASE_URL##*/}"
    _db="${_db%%\?*}"
    if [[ "$_db" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        TEST_DB="$_db"
    fi
fi

APT_UPDATED=0
apt_install() {
    if ! is_root; then
        die "$* is not installed and this is not root; install it yourself" \
            "(sudo apt-get install -y $*), or set DPRELEASE_SKIP_SERVICES=1"
    fi
    command -v apt-get >/dev/null 2>&1 || die "$* is missing and there is no apt-get here"
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        apt-get update -q >&2 || {
            log "apt-get update failed; retrying once in 10 s"
            sleep 10
            apt-get update -q >&2
        }
        APT_UPDATED=1
    fi
    log "apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2
}

wait_for() { # wait_for DESCRIPTION COMMAND...
    local what="$1" i
    shift
    for ((i = 0; i < WAIT_SECONDS; i++)); do
        if "$@"; then
            log "$what is ready"
            return 0
        fi
        sleep 1
    done
    return 1
}

# ---------------------------------------------------------------- PostgreSQL

pg_ready() {
    command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h "$PG_HOST" -p "$PG_PORT"
}

# First PostgreSQL version under /etc/postgresql that has the cluster; empty if none.
pg_version() {
    local d
    for d in "$PG_ETC"/*/"$PG_CLUSTER"; do
        if [ -d "$d" ]; then
            d="${d#"$PG_ETC"/}"
            printf '%s\n' "${d%%/*}"
            return 0
        fi
    done
}

# Succeeds when the first pg_hba.conf rule that can match a TCP connection from 127.0.0.1 by
# user postgres is "trust" for all databases (pg_hba.conf is first-match).
pg_hba_trusts_local_postgres() {
    awk -v user="$PG_USER" '
        /^[[:space:]]*(#|$)/ { next }
        $1 == "host" || $1 == "hostssl" || $1 == "hostnossl" {
            if ($2 == "replication") next
            n = split($3, users, ",")
            user_ok = 0
            for (i = 1; i <= n; i++) if (users[i] == "all" || users[i] == user) user_ok = 1
            if (!user_ok) next
            addr = $4
            if (!(addr ~ /^127\./ || addr == "0.0.0.0/0" || addr == "all" || addr == "samehost" \
                  || addr == "samenet" || addr == "localhost")) next
            # A bare IPv4 address is followed by a separate netmask column.
            method = (addr ~ /^[0-9.]+$/) ? $6 : $5
            found = 1
            exit (method == "trust" && $2 == "all") ? 0 : 1
        }
        END { if (!found) exit 1 }
    ' "$1"
}

# Make sure TCP connections from 127.0.0.1 as postgres are trusted; prints "changed" when it
# had to edit pg_hba.conf.
pg_ensure_trust() {
    local hba="$PG_ETC/$1/$PG_CLUSTER/pg_hba.conf"
    if [ ! -f "$hba" ]; then
        log "no $hba; not checking authentication"
        return 0
    fi
    if pg_hba_trusts_local_postgres "$hba"; then
        log "$hba already trusts $PG_USER from 127.0.0.1"
        return 0
    fi
    if [ ! -w "$hba" ]; then
        log "WARNING: $hba does not trust $PG_USER from 127.0.0.1 and is not writable here"
        return 0
    fi
    log "adding 'host all $PG_USER 127.0.0.1/32 trust' as the first rule of $hba"
    cp -p "$hba" "$hba.dprelease.bak"
    # Insert before the first active rule so that it wins (first match), keeping the header.
    awk -v marker="$HBA_MARKER" -v rule="host    all    $PG_USER    127.0.0.1/32    trust" '
        !done && !/^[[:space:]]*(#|$)/ { print marker; print rule; done = 1 }
        { print }
        END { if (!done) { print marker; print rule } }
    ' "$hba.dprelease.bak" >"$hba.dprelease.tmp"
    chown --reference="$hba" "$hba.dprelease.tmp" 2>/dev/null || true
    chmod --reference="$hba" "$hba.dprelease.tmp" 2>/dev/null || true
    mv "$hba.dprelease.tmp" "$hba"
    echo changed
}

ensure_postgres() {
    local ver changed=""
    ver="$(pg_version)"
    if pg_ready; then
        log "PostgreSQL is accepting connections on $PG_HOST:$PG_PORT"
        # Still make sure a local cluster trusts the test user (reload only if we edited).
        if [ -n "$ver" ] && is_root; then
            changed="$(pg_ensure_trust "$ver")"
            if [ "$changed" = changed ]; then
                log "pg_ctlcluster $ver $PG_CLUSTER reload"
                pg_ctlcluster --skip-systemctl-redirect "$ver" "$PG_CLUSTER" reload >&2
            fi
        fi
        return 0
    fi

    log "PostgreSQL is not accepting connections on $PG_HOST:$PG_PORT"
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$ver" ]; then
        log "PostgreSQL is not installed (no pg_ctlcluster or no cluster under /etc/postgresql)"
        apt_install postgresql
        ver="$(pg_version)"
        [ -n "$ver" ] || die "apt-get installed postgresql but created no cluster in /etc/postgresql"
        if pg_ready; then # the package may have started it itself
            log "PostgreSQL $ver started by the package"
        fi
    fi

    pg_ensure_trust "$ver" >/dev/null
    if ! pg_ready; then
        log "pg_ctlcluster --skip-systemctl-redirect $ver $PG_CLUSTER start"
        # Non-zero also when it is already starting; readiness below is what counts.
        pg_ctlcluster --skip-systemctl-redirect "$ver" "$PG_CLUSTER" start >&2 ||
            log "pg_ctlcluster start returned non-zero; waiting for readiness anyway"
    else
        # Up (started by apt): apply a pg_hba.conf edit, if any.
        pg_ctlcluster --skip-systemctl-redirect "$ver" "$PG_CLUSTER" reload >&2 || true
    fi
    wait_for "PostgreSQL on $PG_HOST:$PG_PORT" pg_ready ||
        die "PostgreSQL did not become ready within ${WAIT_SECONDS}s" \
            "(see /var/log/postgresql/postgresql-$ver-$PG_CLUSTER.log)"
}

# --------------------------------------------------------------------- Redis

redis_ready() {
    command -v redis-cli >/dev/null 2>&1 &&
        [ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
}

ensure_redis() {
    if redis_ready; then
        log "Redis answers PONG on $REDIS_HOST:$REDIS_PORT"
        return 0
    fi
    log "Redis is not answering on $REDIS_HOST:$REDIS_PORT"
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        log "Redis is not installed"
        apt_install redis-server
        if redis_ready; then
            log "Redis started by the package"
            return 0
        fi
    fi

    local dir=/var/lib/redis logdir=/var/log/redis
    if ! mkdir -p "$dir" "$logdir" 2>/dev/null || [ ! -w "$dir" ] || [ ! -w "$logdir" ]; then
        # Not root: keep everything in a private directory.
        dir="${TMPDIR:-/tmp}/dprelease-redis"
        logdir="$dir"
        mkdir -p "$dir"
        log "/var/lib/redis or /var/log/redis not writable; using $dir"
    fi
    log "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port $REDIS_PORT --save ''" \
        "--appendonly no --dir $dir --logfile $logdir/ci.log"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
        --appendonly no --dir "$dir" --logfile "$logdir/ci.log" >&2
    wait_for "Redis on $REDIS_HOST:$REDIS_PORT" redis_ready ||
        die "Redis did not answer PONG within ${WAIT_SECONDS}s (see $logdir/ci.log)"
}

# ------------------------------------------------------------- test database

test_db_exists() {
    [ "$(psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -w -tAc \
        "SELECT 1 FROM pg_database WHERE datname='$TEST_DB'")" = 1 ]
}

ensure_test_db() {
    if test_db_exists; then
        log "database $TEST_DB exists"
        return 0
    fi
    log "createdb -h $PG_HOST -p $PG_PORT -U $PG_USER $TEST_DB"
    # A concurrent run may create it between the check and here: re-check on failure.
    createdb -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -w "$TEST_DB" >&2 || test_db_exists ||
        die "could not create database $TEST_DB"
}

ensure_postgres
ensure_redis
ensure_test_db
log "services ready: postgresql://$PG_USER@$PG_HOST:$PG_PORT/$TEST_DB," \
    "redis://$REDIS_HOST:$REDIS_PORT"
