"""The compiler cache: sccache as the launcher, the build's own servers, the configure-time probe, the end-of-build report."""
