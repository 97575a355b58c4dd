# The two set-up commands of the README: `make demo` and `make test`. Python packages go into
# the project's own virtual environment (.venv), never the system interpreter.
PYTHON ?= python3
VENV = .venv
PY = $(VENV)/bin/python
DEBIAN_PACKAGES = fio liburing-dev blktrace e2fsprogs fdisk util-linux mount postgresql qemu-system-x86 debootstrap chromium \
	linux-source make gcc flex bison bc git mariadb-server-core mariadb-client-core sysbench \
	rocksdb-tools imagemagick ffmpeg nginx iproute2 libreoffice-writer-nogui libreoffice-calc-nogui

.PHONY: install demo deps packages test quick-test clean-cache

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(PY)
	$(PY) -m pip install -q -e '.[test,cluster]'

demo: install
	$(VENV)/bin/replay run oltp

# Debian packages the tests use: fio and blktrace as peers and reference decoders,
# mkfs/sfdisk/losetup/blkid for loop-device targets; for the capture recipes PostgreSQL,
# MariaDB and sysbench, RocksDB's db_bench, ImageMagick (its convert by Debian's own name),
# ffmpeg, nginx (and iproute2's ss, which checks it listens on 127.0.0.1 only), LibreOffice's
# headless Writer and Calc, git, the kernel's source and its build tools, qemu and debootstrap;
# chromium to render reports; liburing-dev for bench/floor.c.
deps:
	@for tool in fio blkparse mkfs.ext4 sfdisk losetup blkid mount pg_ctlcluster qemu-system-x86_64 debootstrap chromium \
			make gcc flex bison bc git mariadbd my_print_defaults sysbench db_bench ffmpeg nginx ss; do \
		command -v $$tool >/dev/null || { $(MAKE) --no-print-directory packages; break; }; \
	done
	@for file in /usr/include/liburing.h /usr/src/linux-source-*.tar.xz /usr/bin/convert-im*.q16 \
			/usr/lib/libreoffice/program/libswlo.so /usr/lib/libreoffice/program/libsclo.so; do \
		test -e $$file || { $(MAKE) --no-print-directory packages; break; }; \
	done

# Installs DEBIAN_PACKAGES and starts no service: Debian's maintainer scripts ask policy-rc.d
# before starting one, and its exit 101 says no (nginx's postinst would start a system nginx on
# port 80 on a host with systemd). Ours is there only while apt-get runs and is removed even when
# it fails or is interrupted; a policy-rc.d already there is the host's, used and left alone.
POLICY_RC_D = /usr/sbin/policy-rc.d
packages:
	@if [ ! -e $(POLICY_RC_D) ]; then \
		trap 'rm -f $(POLICY_RC_D)' EXIT; trap 'exit 130' INT TERM HUP; \
		printf '#!/bin/sh\n# make packages (tracereplay): no service starts while it installs.\nexit 101\n' \
			> $(POLICY_RC_D) && chmod 755 $(POLICY_RC_D) || exit; \
	fi; \
	apt-get update -q && apt-get install -y -q $(DEBIAN_PACKAGES)

test: deps install
	cd engine && cargo test --release --no-default-features
	$(PY) -m pytest -q

# The suite without the Debian packages: tests that need a missing tool skip, saying which.
quick-test: install
	$(PY) -m pytest -q

# What `make test` leaves outside the checkout: the boot recipe's cached guest image.
clean-cache:
	rm -rf /var/cache/tracereplay
