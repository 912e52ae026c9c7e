#!/usr/bin/env bash
# Makes certificates for live migrations over TCP with mutual TLS (`exitless run
# --migration-tls-dir DIR`, docs/migration-tcp-tls.md), with the openssl command-line tool:
#
#   scripts/tls-certs.sh OUT HOST...
#
#   OUT/ca/ca.pem, OUT/ca/ca-key.pem  a CA (made once; kept and reused when OUT/ca exists)
#   OUT/HOST/ca.pem                   that CA's certificate: what HOST trusts
#   OUT/HOST/cert.pem                 HOST's certificate, signed by the CA: subjectAltName
#                                     IP:HOST (or DNS:HOST for a name), extended key usage
#                                     serverAuth and clientAuth (either end of a migration)
#   OUT/HOST/key.pem                  its private key (ECDSA P-256), mode 0600
#
# HOST is the address the source names in `tcp:HOST:PORT` when HOST receives; a source's own
# certificate is checked against the CA only. Run it again with another OUT for a second CA
# that the first one's hosts do not trust. Everything is made with umask 077 (directories 0700,
# files 0600). Certificates are valid for 30 days: for tests, benchmarks and trying it out; an
# operator's own CA does the same with its own policy.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 OUT HOST... (HOST: the IP address, or name, each host's certificate names)" >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "$0: needs the openssl command (Debian's openssl package)" >&2; exit 1; }
out=$1
shift
umask 077
mkdir -p "$out/ca"
ca="$out/ca/ca.pem"
ca_key="$out/ca/ca-key.pem"
if [ ! -s "$ca" ] || [ ! -s "$ca_key" ]; then
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$ca_key" -out "$ca" -days 30 -subj "/CN=exitless migration CA $(date +%s%N)" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        2>/dev/null
fi
for host in "$@"; do
    case "$host" in
        */* | '' | . | .. | ca) echo "$0: $host is not a host name or address" >&2; exit 2 ;;
    esac
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then
        san="IP:$host"
    else
        san="DNS:$host"
    fi
    dir="$out/$host"
    mkdir -p "$dir"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$dir/key.pem" -out "$dir/request.pem" -subj "/CN=$host" 2>/dev/null
    printf '%s\n' "[host]" "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" >"$dir/extensions.cnf"
    openssl x509 -req -in "$dir/request.pem" -CA "$ca" -CAkey "$ca_key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 30 \
        -extfile "$dir/extensions.cnf" -extensions host -out "$dir/cert.pem" 2>/dev/null
    rm -f "$dir/request.pem" "$dir/extensions.cnf"
    cp "$ca" "$dir/ca.pem"
    chmod 600 "$dir/key.pem"
done
