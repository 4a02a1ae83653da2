# Thin wrapper around meson for the two commands of the quick start, and a few more.
#   make run     build and start sluiced in the foreground on etc/sluice.conf (as root:
#                the user sluice is created if missing; sluiced drops to it)
#   make check   build and run the whole test suite, then again under ASan+UBSan
#   make bench   milter, rules, store, policy, Redis, intake and relay benchmarks (bench/README.md)
#   make soak    a million milter sessions beside 10,000 held connections: memory, fds, threads
#   make bench-queue  the relay at deferred backlogs of 10,000 to 1,000,000, beside Postfix
#   make fuzz    run every fuzzer for FUZZ_TIME seconds each (clang, libFuzzer)
#   make deb     the Debian package, built from a copy of the tree: build/deb/sluice_*.deb
# Missing Debian packages are installed first when running as root (Debian 12).

BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 600
MESON_TEST_FLAGS ?= --print-errorlogs --num-processes 1

BUILD_PKGS = meson ninja-build pkg-config gcc libevent-dev libcmocka-dev scdoc libxxhash-dev libhiredis-dev libssl-dev libgsasl-dev libc-ares-dev
TEST_PKGS = postfix miltertest swaks python3-pytest redis-server clang libclang-rt-14-dev faketime python3-xxhash bsd-mailx python3-aiosmtpd python3-cryptography openssl sendmail-cf m4 libwrap0 libdb5.3 libldap-2.5-0 liblockfile1 libnsl2 libsasl2-2 unbound nsd ldnsutils python3-dnslib prometheus
BENCH_PKGS = libmilter-dev redis-server postfix python3-pytest strace
FUZZ_PKGS = clang libclang-rt-14-dev
DEB_PKGS = build-essential debhelper dpkg-dev fakeroot lintian
# the power-cut tests' disk (tests/powercut): a FUSE file system
TEST_PKGS += fuse3 libfuse3-dev
# the slow test tests/func/test_deb.py builds the package
TEST_PKGS += $(DEB_PKGS)
# test_journald.py runs systemd-journald and journalctl; the package installs them (and
# /etc/machine-id) without touching PID 1 (that is systemd-sysv's /sbin/init, not added)
TEST_PKGS += systemd
# where `make deb` leaves sluice_VERSION_ARCH.deb (and its .changes and .buildinfo)
DEB_DIR ?= $(BUILD)/deb
VERSION := $(shell sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build)

.PHONY: all build run check test asan-check bench bench-queue soak fuzz clean deps-build deps-test deps-bench deb deps-deb

all: build

define install_missing
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root, or: apt-get install$$missing)"; exit 1; fi; \
	  echo "installing:$$missing"; \
	  echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null || \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; }; \
	fi
endef

deps-build:
	$(call install_missing,$(BUILD_PKGS))

deps-test: deps-build
	$(call install_missing,$(TEST_PKGS))

deps-bench: deps-build
	$(call install_missing,$(BENCH_PKGS))

deps-deb: deps-build
	$(call install_missing,$(DEB_PKGS))

$(BUILD)/build.ninja:
	meson setup $(BUILD)

build: deps-build $(BUILD)/build.ninja
	ninja -C $(BUILD)

# etc/sluice.conf runs sluiced as the system user sluice, made here if missing.
run: build
	@id -u sluice >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	  adduser --system --group --no-create-home --quiet sluice 2>/dev/null || \
	  useradd --system --user-group --no-create-home --shell /usr/sbin/nologin sluice
	exec $(BUILD)/src/daemon/sluiced -c etc/sluice.conf

test: deps-test build
	meson test -C $(BUILD) $(MESON_TEST_FLAGS)

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug

asan-check: deps-test $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  meson test -C $(ASAN_BUILD) $(MESON_TEST_FLAGS) --timeout-multiplier 3

check: test asan-check

bench: deps-bench build
	bench/run_milter.sh $(BUILD)
	bench/idle_ab.sh $(BUILD)
	$(BUILD)/bench/store_bench
	bench/run_rules.sh $(BUILD)
	bench/run_policy.sh $(BUILD)
	bench/run_redis_scripts.sh $(BUILD)
	bench/run_redis.sh $(BUILD)
	bench/run_intake.py $(BUILD)
	bench/run_relay.py $(BUILD)

# Not part of bench: it takes well over 20 minutes (bench/README.md, "The deferred-backlog
# benchmark").
bench-queue: deps-bench build
	bench/run_queue_scale.py $(BUILD)

# Not part of bench: it takes minutes (bench/README.md, "The soak").
soak: deps-build build
	bench/soak.py $(BUILD)

$(FUZZ_BUILD)/build.ninja:
	CC=clang meson setup $(FUZZ_BUILD) -Dfuzzing=true -Dfunc_tests=false \
	  -Db_sanitize=address,undefined -Db_lundef=false

fuzz: deps-build $(FUZZ_BUILD)/build.ninja
	$(call install_missing,$(FUZZ_PKGS))
	ninja -C $(FUZZ_BUILD)
	@# the harnesses only: Meson's fuzz_*.p object folders match the pattern too
	@failed=""; for f in $(FUZZ_BUILD)/tests/fuzz/fuzz_*; do \
	  [ -f "$$f" ] && [ -x "$$f" ] || continue; \
	  name=$${f##*/fuzz_}; mkdir -p $(FUZZ_BUILD)/corpus/$$name; \
	  echo "== $$name ($(FUZZ_TIME) s)"; \
	  $$f -max_total_time=$(FUZZ_TIME) -print_final_stats=1 $(FUZZ_BUILD)/corpus/$$name tests/fuzz/corpus/$$name || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzzers that found a crash:$$failed (see the crash-* files)"; exit 1; fi

# The package (debian/, doc/OPERATIONS.md "Debian package"): dpkg-buildpackage writes
# into the parent of the tree it builds, so it builds a copy of the tree (without the
# build directories and .git) in $(DEB_DIR)/sluice-$(VERSION); nothing is written
# outside $(DEB_DIR).  It builds the source package too (sluice_VERSION.dsc and .tar.xz,
# a few seconds), so that lintian, which must find no error and no warning that
# debian/sluice.lintian-overrides does not explain, checks debian/ as a source as well.
deb: deps-deb
	@v=$$(dpkg-parsechangelog -l debian/changelog -S Version); [ "$$v" = "$(VERSION)" ] || \
	  { echo "debian/changelog is at $$v, meson.build at $(VERSION): add a changelog entry (dch -v $(VERSION))"; exit 1; }
	rm -rf $(DEB_DIR)/sluice-$(VERSION) $(DEB_DIR)/sluice_$(VERSION)_* $(DEB_DIR)/sluice_$(VERSION).* \
	  $(DEB_DIR)/sluice-dbgsym_$(VERSION)_*
	mkdir -p $(DEB_DIR)/sluice-$(VERSION)
	tar -cf - --exclude-vcs --exclude='./build*' --exclude='./$(BUILD)' --exclude='./$(DEB_DIR)' \
	  --exclude=__pycache__ --exclude='*.pyc' --exclude=.pytest_cache . | \
	  tar -xf - -C $(DEB_DIR)/sluice-$(VERSION)
	cd $(DEB_DIR)/sluice-$(VERSION) && dpkg-buildpackage -us -uc -jauto
	rm -rf $(DEB_DIR)/sluice-$(VERSION)
	lintian --fail-on error,warning $(DEB_DIR)/sluice_$(VERSION)_*.changes
	@ls $(DEB_DIR)/sluice_$(VERSION)_*.deb

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
