#!/usr/bin/env bash
# deps.sh installs the system packages Arbor needs and a private CRIU 4.x.
#
# Idempotent and fast when everything is present: no apt-get update then.
# Layout and reasons: docs/install.md.
#
# Environment:
#   ARBOR_CRIU_PREFIX  private CRIU prefix            (/opt/arbor/criu)
#   ARBOR_CRIU_SUITE   Debian suite to take CRIU from (sid: this kernel needs
#                      CRIU >= 4.2, whose dumps of TCP sockets work on 6.16+)
#   ARBOR_APT_DIR      private apt state for it       (/var/cache/arbor/apt-<suite>)
#   ARBOR_PRIVATE_CRIU=1  install the private CRIU even if a system criu >= 4.0 exists
set -euo pipefail

PREFIX=${ARBOR_CRIU_PREFIX:-/opt/arbor/criu}
SUITE=${ARBOR_CRIU_SUITE:-sid}
APTDIR=${ARBOR_APT_DIR:-/var/cache/arbor/apt-$SUITE}
WRAPPER=$PREFIX/bin/criu

# System packages, grouped by what needs them.
PKGS=(
	# filesystem snapshot backends and images
	btrfs-progs zfs-fuse e2fsprogs util-linux mount busybox-static debootstrap xz-utils zstd
	# OCI images: a real registry for the image tests (the CNCF distribution
	# registry), and skopeo, the peer the pull benchmark measures against
	docker-registry skopeo
	# sandboxes, and runc as a side-by-side peer (its CRIU network lock is iptables)
	iproute2 iptables nftables runc procps
	# the sandboxes' seccomp filter, compiled by the server (cgo)
	libseccomp-dev pkg-config
	# eBPF code generation (bpf2go) and inspection
	clang llvm libbpf-dev bpftool
	# the syscall table TestClassesCoverKernelHeaders (bpf) checks the classes against
	linux-libc-dev
	# Python client and its tests
	python3 python3-msgpack python3-websockets
	# the web view's browser test (server/ui): headless Chromium
	chromium
	# the MCP endpoint's conformance test (agent): the official TypeScript SDK
	nodejs npm
	# this script: dpkg -x, apt-get download
	dpkg apt ca-certificates
)

log() { printf 'deps: %s\n' "$*"; }
die() {
	printf 'deps: error: %s\n' "$*" >&2
	exit 1
}

[[ $(id -u) == 0 ]] || die "must run as root (try: sudo make deps)"
export DEBIAN_FRONTEND=noninteractive

# --- system packages -------------------------------------------------------

missing_pkgs() {
	local -A ok=()
	local p st
	while read -r p st; do
		if [[ $st == ii* ]]; then ok[$p]=1; fi
	done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PKGS[@]}" 2>/dev/null || true)
	# A package that an installed one provides is there too (NodeSource's
	# nodejs provides npm, and conflicts with Debian's).
	while read -r st p; do
		[[ $st == ii* ]] || continue
		for p in ${p//,/ }; do ok[$p]=1; done
	done < <(dpkg-query -W -f='${db:Status-Abbrev} ${Provides}\n' 2>/dev/null || true)
	for p in "${PKGS[@]}"; do
		[[ -n ${ok[$p]:-} ]] || echo "$p"
	done
}

updated=0
apt_update() {
	((updated)) && return 0
	log "apt-get update"
	apt-get -qq update >/dev/null
	updated=1
}

# has_candidate reports whether apt knows a version of every package given.
has_candidate() {
	local p
	for p in "$@"; do
		[[ $(apt-cache policy "$p" 2>/dev/null) == *"Candidate: "[!\(]* ]] || return 1
	done
}

install_system() {
	local -a miss
	mapfile -t miss < <(missing_pkgs)
	((${#miss[@]})) || return 0
	local p
	for p in "${miss[@]}"; do log "install $p"; done
	has_candidate "${miss[@]}" || apt_update
	local out
	if ! out=$(apt-get install -y -qq --no-install-recommends "${miss[@]}" 2>&1); then
		# Stale lists give 404s: refresh once and retry.
		((updated)) && die "apt-get install failed:"$'\n'"$out"
		apt_update
		apt-get install -y -qq --no-install-recommends "${miss[@]}" >/dev/null ||
			die "apt-get install ${miss[*]} failed"
	fi
}

# --- CRIU 4.x --------------------------------------------------------------

# criu_major prints the major version a criu binary reports, or nothing.
criu_major() {
	local v
	v=$("$@" --version 2>/dev/null) || return 0
	sed -n 's/^Version: *\([0-9][0-9]*\)\..*/\1/p' <<<"$v" | head -n1
}

# criu_new_enough succeeds when a criu binary is 4.2 or newer: older ones
# fail to dump TCP sockets on kernels >= 6.16 ("Can't get 1:16 opt"), as
# they read SO_PASSCRED, which those kernels refuse on non-unix sockets.
criu_new_enough() {
	local v maj min
	v=$("$@" --version 2>/dev/null) || return 1
	read -r maj min < <(sed -n 's/^Version: *\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p' <<<"$v" | head -n1)
	[[ -n $maj ]] && ((maj > 4 || (maj == 4 && min >= 2)))
}

# debian_source prints "URI<TAB>SIGNED-BY" of the machine's main Debian
# source: the deb entry whose suite is exactly this release's codename.
debian_source() {
	local codename
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	[[ -n $codename ]] || die "no VERSION_CODENAME in /etc/os-release"
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -e $f ]] || continue
		awk -v want="$codename" '
			function flush() {
				if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " want " ") && uris != "") {
					split(uris, u, " "); printf "%s\t%s\n", u[1], signed; found = 1; exit
				}
				types = uris = suites = signed = ""
			}
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); next }
			/^Types:/     { sub(/^Types:[ \t]*/, "");     types = $0 }
			/^URIs:/      { sub(/^URIs:[ \t]*/, "");      uris = $0 }
			/^Suites:/    { sub(/^Suites:[ \t]*/, "");    suites = $0 }
			/^Signed-By:/ { sub(/^Signed-By:[ \t]*/, ""); signed = ($0 ~ /^\//) ? $0 : "" }
			END { if (!found) flush() }
		' "$f"
	done | head -n1 | grep . && return 0
	# One-line format: deb [opts] URI SUITE COMPONENTS...
	cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v want="$codename" '
		$1 != "deb" { next }
		{
			signed = ""; i = 2
			if ($2 ~ /^\[/) {
				for (; i <= NF; i++) {
					if ($i ~ /signed-by=/) { s = $i; sub(/.*signed-by=/, "", s); sub(/\]$/, "", s); signed = s }
					if ($i ~ /\]$/) { i++; break }
				}
			}
			if ($(i + 1) == want) { printf "%s\t%s\n", $i, signed; exit }
		}' | grep . || die "no Debian $codename source found in /etc/apt"
}

apt_private() {
	apt-get \
		-o Dir::Etc::sourcelist=/dev/null \
		-o Dir::Etc::sourceparts="$APTDIR/sources.list.d" \
		-o Dir::Etc::preferences=/dev/null \
		-o Dir::Etc::preferencesparts="$APTDIR/preferences.d" \
		-o Dir::State::Lists="$APTDIR/lists" \
		-o Dir::State::status="$APTDIR/status" \
		-o Dir::Cache="$APTDIR/cache" \
		-o Dir::Cache::archives="$APTDIR/archives" \
		-o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
		-o APT::Sandbox::User=root \
		"$@"
}

apt_cache_private() {
	apt-cache \
		-o Dir::Etc::sourcelist=/dev/null \
		-o Dir::Etc::sourceparts="$APTDIR/sources.list.d" \
		-o Dir::Etc::preferences=/dev/null \
		-o Dir::Etc::preferencesparts="$APTDIR/preferences.d" \
		-o Dir::State::Lists="$APTDIR/lists" \
		-o Dir::State::status="$APTDIR/status" \
		-o Dir::Cache="$APTDIR/cache" \
		"$@"
}

write_wrapper() { # write_wrapper FILE PREFIX NO_BREAKPOINTS
	local fault=""
	if [[ $3 == 1 ]]; then
		fault=': "${CRIU_FAULT:=130}"  # hardware breakpoints do not fire on this host (docs/install.md)
export CRIU_FAULT'
	fi
	cat >"$1" <<EOF
#!/bin/sh
# CRIU $SUITE with its own loader and libraries (written by scripts/deps.sh).
$fault
exec $2/usr/lib64/ld-linux-x86-64.so.2 --library-path $2/usr/lib/x86_64-linux-gnu $2/usr/sbin/criu "\$@"
EOF
	chmod 0755 "$1"
}

# dump_hangs reports whether a dump of a sleeping process through criu
# binary $1 fails to finish in 15 s, the symptom of hardware breakpoints
# that never fire (seen in VMs). Extra env for criu goes in $2.
dump_hangs() { # stderr muted: bash reports the killed sleep
	local dir pid rc=0
	dir=$(mktemp -d)
	setsid sleep 600 </dev/null >/dev/null 2>&1 &
	pid=$!
	sleep 0.2
	env $2 timeout -k 2 15 "$1" dump -t "$pid" -D "$dir" -o dump.log >/dev/null 2>&1 || rc=$?
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -rf "$dir"
	[[ $rc == 124 || $rc == 137 ]]
} 2>/dev/null

install_criu() {
	local m
	if criu_new_enough "$WRAPPER"; then
		return 0
	fi
	if [[ ${ARBOR_PRIVATE_CRIU:-0} != 1 ]] && command -v criu >/dev/null; then
		if criu_new_enough criu; then
			log "using system $(command -v criu) ($(criu --version | head -n1))"
			return 0
		fi
	fi

	log "install criu from Debian $SUITE into $PREFIX"
	local src uri signed
	src=$(debian_source)
	uri=${src%%$'\t'*}
	signed=${src#*$'\t'}
	mkdir -p "$APTDIR"/{sources.list.d,preferences.d,lists/partial,cache,archives/partial,debs}
	touch "$APTDIR/status"
	{
		echo "Types: deb"
		echo "URIs: $uri"
		echo "Suites: $SUITE"
		echo "Components: main"
		[[ -n $signed ]] && echo "Signed-By: $signed"
	} >"$APTDIR/sources.list.d/$SUITE.sources"
	apt_private -qq update >/dev/null || die "apt-get update of the private $SUITE source failed"

	local -a closure
	mapfile -t closure < <(apt_cache_private depends --recurse --no-recommends --no-suggests \
		--no-conflicts --no-breaks --no-replaces --no-enhances criu | grep -v '^ ' | sort -u)
	((${#closure[@]})) || die "cannot resolve criu in $SUITE"
	rm -f "$APTDIR"/debs/*.deb
	(cd "$APTDIR/debs" && apt_private -qq download "${closure[@]}" >/dev/null) ||
		die "apt-get download ${closure[*]} failed"

	# Unpack into a staging folder, then swap it in whole.
	local stage=$PREFIX.new
	rm -rf "$stage"
	mkdir -p "$stage/bin"
	local d
	for d in "$APTDIR"/debs/*.deb; do dpkg -x "$d" "$stage"; done
	[[ -x $stage/usr/sbin/criu && -e $stage/usr/lib64/ld-linux-x86-64.so.2 ]] ||
		die "unpacked criu is incomplete in $stage"
	# Paths in the wrapper name the final prefix; probe through a staging one.
	write_wrapper "$stage/bin/criu.stage" "$stage" 0
	m=$(criu_major "$stage/bin/criu.stage")
	[[ -n $m ]] && ((m >= 4)) || die "unpacked criu does not run: $("$stage/bin/criu.stage" --version 2>&1 | head -n3)"
	local nobp=0
	if dump_hangs "$stage/bin/criu.stage" ""; then
		if dump_hangs "$stage/bin/criu.stage" CRIU_FAULT=130; then
			log "warning: criu dump hangs here even without hardware breakpoints"
		else
			log "hardware breakpoints do not fire on this host: the wrapper sets CRIU_FAULT=130"
			nobp=1
		fi
	fi
	rm -f "$stage/bin/criu.stage"
	write_wrapper "$stage/bin/criu" "$PREFIX" "$nobp"
	rm -rf "$PREFIX.old"
	[[ -e $PREFIX ]] && mv "$PREFIX" "$PREFIX.old"
	mv "$stage" "$PREFIX"
	rm -rf "$PREFIX.old"

	log "$("$WRAPPER" --version | head -n1) at $WRAPPER"
	local check
	if check=$("$WRAPPER" check 2>&1); then
		log "criu check: $(tail -n1 <<<"$check")"
	else
		log "warning: criu check failed:"$'\n'"$check"
	fi
}

install_system
install_criu
