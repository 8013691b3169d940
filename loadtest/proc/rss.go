package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MaxMemBytes bounds the memory figures read from /proc (1 PiB): more is
// a misreading.
const MaxMemBytes = 1 << 50

// RSS is a process's resident set size in bytes (VmRSS in
// /proc/<pid>/status; Linux only).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return parseVmRSS(b)
}

// RSS is the process's resident set size in bytes (see the function RSS).
func (p *Process) RSS() (int64, error) { return RSS(p.Pid()) }

// parseVmRSS reads the "VmRSS:   1234 kB" line of /proc/<pid>/status.
func parseVmRSS(b []byte) (int64, error) {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte("\n"))
		v, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := strings.Fields(string(v))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("proc status: bad VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > MaxMemBytes>>10 {
			return 0, fmt.Errorf("proc status: bad VmRSS line %q", line)
		}
		return kb << 10, nil
	}
	return 0, errors.New("proc status: no VmRSS line (a kernel thread, or the process exited)")
}
