#!/bin/sh
# install-system-packages.sh HANDLER_DIR: the Debian packages the handler's
# system-packages.txt names, installed with apt-get (the Dockerfile runs it in
# both stages: for a requirement that builds against a library, and for the
# libraries the model loads at run time).
#
# The file sits beside this script in the folder the Dockerfile copied both to
# (it is optional; without it nothing is installed), and the folder is removed
# afterwards. One name or name=version per line; # starts a comment. Each name
# is checked before apt-get sees it, so the file cannot inject options or shell.
set -euf
handler_dir=${1:?usage: install-system-packages.sh HANDLER_DIR}
here=$(dirname "$0")
list="$here/system-packages.txt"
packages=""
if [ -f "$list" ]; then packages=$(sed -e 's/#.*//' -e 's/\r$//' "$list"); fi
rm -rf "$here"
# Split into words on purpose (set -f above: no globbing).
# shellcheck disable=SC2086
set -- $packages
for name do
    case $name in
        [!a-z0-9]* | *[!A-Za-z0-9.+:=~-]*)
            echo "$handler_dir/system-packages.txt: '$name' is not a Debian package name" \
                "(one name or name=version per line; # starts a comment)" >&2
            exit 1
            ;;
    esac
done
[ "$#" -gt 0 ] || exit 0
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
rm -rf /var/lib/apt/lists/*
