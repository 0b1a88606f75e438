"""Pure parsers of what commands print on nodes: fio, lsblk/blkid and block stats, nvme-cli and configfs,
/proc and /sys facts, Prometheus metrics, server-sent events, the G3 reader's series. No I/O."""
