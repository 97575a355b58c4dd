# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
DEBIAN_PACKAGES = fio e2fsprogs fdisk util-linux mount postgresql qemu-system-x86 debootstrap chromium

.PHONY: install demo deps test

install:
	$(PYTHON) -m pip install -q -e '.[test]'

demo: install
	replay run oltp

# Debian packages the tests use: fio as a peer, mkfs/sfdisk/losetup/blkid for loop-device targets.
deps:
	@for tool in fio mkfs.ext4 sfdisk losetup blkid mount pg_ctlcluster qemu-system-x86_64 chromium; do \
		command -v $$tool >/dev/null || { apt-get update -q && apt-get install -y -q $(DEBIAN_PACKAGES); break; }; \
	done

test: deps install
	cd engine && cargo test --release --no-default-features
	$(PYTHON) -m pytest -q
