dmesg 2>/dev/null || journalctl -k -b --no-pager -o short-monotonic 2>/dev/null || { echo 'neither dmesg nor journalctl -k is readable' >&2; exit 126; }
