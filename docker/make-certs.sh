#!/bin/sh
# Make the TLS material, the tokens file and the etcd passwords of the compose stack
# (docs/docker.md): a private CA and, for each NAME, a key and a certificate signed
# by it.
#
#   docker/make-certs.sh [-d DIR] [NAME...]
#
# DIR defaults to docker/certs (what docker/compose.yaml mounts). NAMEs default to
# the compose services and a client: etcd1 etcd2 etcd3 bookie1 bookie2 bookie3
# bookie4 client. Each certificate names NAME, localhost and 127.0.0.1 (DNS and IP
# subject alternative names) and serves both as a server and as a client certificate
# (extended key usages serverAuth and clientAuth): etcd members use theirs towards
# clients and peers (and etcd's JSON gateway towards etcd itself), bookies theirs
# towards clients and, as client certificates, towards etcd (mutual TLS everywhere).
# The subject has no common name (CN), only O=asyncbk compose and OU=NAME: with
# authentication on, etcd's JSON gateway, which asyncbk speaks, refuses a client
# certificate that has one (etcd would take the CN for a user name). Layout:
#
#   DIR/ca.pem                   the CA certificate (mounted everywhere)
#   DIR/ca-key.pem               the CA key (mounted nowhere; keep it, or delete it)
#   DIR/NAME/cert.pem            NAME's certificate
#   DIR/NAME/key.pem             NAME's key (mode 0600)
#   DIR/tokens                   bookie tokens, one per line (mode 0600)
#   DIR/etcd-root-password       etcd's root password (mode 0600)
#   DIR/etcd-asyncbk-password    the password of etcd's user asyncbk (mode 0600)
#
# Running it again keeps what exists and adds what is missing (new NAMEs, tokens,
# passwords); it warns about an existing certificate that lacks clientAuth or its
# NAME, or has a CN (made by an older version of this script): delete DIR/NAME and
# run it again to remake it.
# Keys, tokens and passwords are readable by their owner only; the bookie image runs
# as uid 10001, so run as root this script gives the bookies' and the client's keys,
# the tokens and the passwords to 10001; otherwise it prints the command that does.
# Never commit DIR: it holds private keys (docker/.gitignore leaves it out).
set -eu

here="$(cd "$(dirname "$0")" && pwd)"
dir="$here/certs"
if [ "${1:-}" = "-d" ]; then
    [ $# -ge 2 ] || { echo "usage: $0 [-d DIR] [NAME...]" >&2; exit 2; }
    dir="$2"
    shift 2
fi
[ $# -gt 0 ] || set -- etcd1 etcd2 etcd3 bookie1 bookie2 bookie3 bookie4 client
command -v openssl >/dev/null 2>&1 || { echo "make-certs.sh: openssl not found" >&2; exit 1; }

for name in "$@"; do
    case "$name" in
        *[!A-Za-z0-9.-]*|'') echo "make-certs.sh: bad name '$name'" >&2; exit 2 ;;
    esac
done

umask 077
mkdir -p "$dir"
chmod 0755 "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -f "$dir/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" -days 3650 -subj "/CN=asyncbk compose CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    chmod 0644 "$dir/ca.pem"
    echo "made $dir/ca.pem"
fi

for name in "$@"; do
    if [ -f "$dir/$name/cert.pem" ]; then
        # Made earlier, maybe by hand: say what etcd or a bookie would refuse.
        text="$(openssl x509 -noout -subject -ext extendedKeyUsage,subjectAltName \
                    -nameopt multiline -in "$dir/$name/cert.pem" 2>/dev/null || true)"
        case "$text" in *"TLS Web Client Authentication"*) ;; *)
            echo "warning: $dir/$name/cert.pem lacks the clientAuth extended key usage:" \
                 "etcd refuses it as a client certificate" >&2 ;;
        esac
        case "$text" in *"DNS:$name,"*|*"DNS:$name") ;; *)
            echo "warning: $dir/$name/cert.pem does not name $name (subjectAltName)" >&2 ;;
        esac
        case "$text" in *commonName*)
            echo "warning: $dir/$name/cert.pem has a common name (CN): with authentication" \
                 "on, etcd's JSON gateway refuses it as a client certificate" >&2 ;;
        esac
        continue
    fi
    mkdir -p "$dir/$name"
    chmod 0755 "$dir/$name"
    cat >"$tmp/ext" <<EOF
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:$name, DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$dir/$name/key.pem" -out "$tmp/csr" -subj "/O=asyncbk compose/OU=$name" \
        2>/dev/null
    openssl x509 -req -in "$tmp/csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
        -set_serial "0x$(openssl rand -hex 16)" -days 825 -extfile "$tmp/ext" \
        -out "$dir/$name/cert.pem" 2>/dev/null
    chmod 0644 "$dir/$name/cert.pem"
    echo "made $dir/$name/cert.pem"
done

if [ ! -f "$dir/tokens" ]; then
    openssl rand -hex 32 >"$dir/tokens"
    echo "made $dir/tokens (one token; add lines for more)"
fi

for user in root asyncbk; do
    if [ ! -f "$dir/etcd-$user-password" ]; then
        openssl rand -hex 24 >"$dir/etcd-$user-password"
        echo "made $dir/etcd-$user-password"
    fi
done

# The files the bookie image (uid 10001) reads: the bookies' and the client's keys,
# the tokens and the etcd passwords (etcd-auth-init runs the image too).
owned=""
for name in "$@"; do
    case "$name" in etcd*) ;; *) owned="$owned $dir/$name/key.pem" ;; esac
done
owned="$owned $dir/tokens $dir/etcd-root-password $dir/etcd-asyncbk-password"
if [ "$(id -u)" -eq 0 ]; then
    # shellcheck disable=SC2086  # a list of paths without spaces
    chown 10001:10001 $owned
else
    echo "the bookies run as uid 10001 and must read their keys and the tokens:"
    echo "  sudo chown 10001:10001$owned                    # docker, rootful podman"
    echo "  podman unshare chown 10001:10001$owned          # rootless podman"
fi
