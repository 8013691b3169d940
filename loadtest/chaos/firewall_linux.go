package chaos

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"
)

func localSupported() error { return nil }

// firewall is one iptables chain of DROP rules, jumped to from OUTPUT
// only while it holds rules.
type firewall struct {
	chain string

	mu     sync.Mutex
	active bool
}

// newFirewall checks that iptables and its owner match work here by
// creating the (empty, unreferenced) chain.
func newFirewall(chain string) (*firewall, error) {
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil, err
	}
	fw := &firewall{chain: chain}
	if err := iptables("-N", chain); err != nil {
		return nil, err
	}
	// a rule with the owner match proves the module loads; it is removed
	// at once and the chain is not referenced yet
	if err := iptables("-A", chain, "-o", "lo", "-d", "127.0.0.254", "-m", "owner", "--uid-owner", "0", "-j", "RETURN"); err != nil {
		_ = iptables("-X", chain)
		return nil, err
	}
	if err := iptables("-F", chain); err != nil {
		return nil, err
	}
	return fw, nil
}

// block replaces the chain's rules with rules (each the match and target
// of one rule) and makes OUTPUT jump to it.
func (fw *firewall) block(rules [][]string) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if err := iptables("-F", fw.chain); err != nil {
		return err
	}
	for _, r := range rules {
		if err := iptables(append([]string{"-A", fw.chain}, r...)...); err != nil {
			return err
		}
	}
	if !fw.active {
		if err := iptables("-I", "OUTPUT", "1", "-j", fw.chain); err != nil {
			return err
		}
		fw.active = true
	}
	return nil
}

// clear removes the jump and the rules.
func (fw *firewall) clear() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	var err error
	if fw.active {
		// delete every jump, should one have been added twice
		for i := 0; i < 10 && iptables("-D", "OUTPUT", "-j", fw.chain) == nil; i++ {
		}
		fw.active = false
	}
	if e := iptables("-F", fw.chain); e != nil {
		err = e
	}
	return err
}

// close clears and deletes the chain.
func (fw *firewall) close() error {
	if err := fw.clear(); err != nil {
		return err
	}
	return iptables("-X", fw.chain)
}

func iptables(args ...string) error {
	cmd := exec.Command("iptables", append([]string{"-w", "5"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
