"""Things kvgate builds to have something to test: the NVMe-oF loopback (kernel nvmet + nvme-tcp on one
node), the qemu guest that runs it where this kernel cannot, and the N-node network-namespace rig for G3."""
