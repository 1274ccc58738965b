#!/bin/sh
# Make a local Python base image with debootstrap, for build hosts that cannot pull
# from a registry. The image is Debian bookworm (minbase) with Debian's python3
# (3.11) and python3-venv, imported into podman under a localhost/ tag, so it can
# never be mistaken for the official python image:
#
#   sudo docker/make-local-base.sh [TAG]          # default localhost/asyncbk-base:bookworm
#   podman build --build-arg PYTHON_IMAGE=localhost/asyncbk-base:bookworm ...
#
# Needs root (debootstrap), debootstrap and podman. DEBIAN_MIRROR picks the mirror
# (default http://deb.debian.org/debian). Takes about a minute with a close mirror.
set -eu

tag="${1:-localhost/asyncbk-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [ "$(id -u)" -ne 0 ]; then
    echo "make-local-base.sh: debootstrap needs root" >&2
    exit 1
fi
for tool in debootstrap podman tar; do
    command -v "$tool" >/dev/null 2>&1 || { echo "make-local-base.sh: $tool not found" >&2; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/var/tmp}/asyncbk-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT INT TERM

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 20 "$work/debootstrap.log" >&2
    exit 1
}

# What an image does not need: downloaded packages, package lists, docs, locales.
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"* \
       "$work/rootfs/usr/share/doc/"* "$work/rootfs/usr/share/man/"* \
       "$work/rootfs/usr/share/locale/"*

tar -C "$work/rootfs" --numeric-owner -c . |
    podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "$tag"
