"""What runs on the nodes themselves (their own toolchain, their checkout of the pinned commit)."""
