package gossip

import (
	"fmt"
	"slices"
	"testing"
)

func TestRendezvous(t *testing.T) {
	members := []string{"router-a", "router-b", "router-c", "router-d", "router-e"}
	counts := map[string]int{}
	owner := map[string]string{}
	for i := range 5000 {
		b := fmt.Sprintf("gpu-%d", i)
		o := rendezvous(members, b)
		// Order of the member list does not matter.
		rev := slices.Clone(members)
		slices.Reverse(rev)
		if o2 := rendezvous(rev, b); o2 != o {
			t.Fatalf("%s: owner %s vs %s with reversed members", b, o, o2)
		}
		counts[o]++
		owner[b] = o
	}
	for _, m := range members {
		if c := counts[m]; c < 800 || c > 1200 {
			t.Errorf("member %s owns %d of 5000 backends", m, c)
		}
	}
	// Removing a member moves only its backends.
	rest := []string{"router-a", "router-b", "router-d", "router-e"}
	moved := 0
	for b, o := range owner {
		n := rendezvous(rest, b)
		if o != "router-c" && n != o {
			t.Fatalf("%s moved from %s to %s though %s stayed", b, o, n, o)
		}
		if o == "router-c" {
			moved++
		}
	}
	if moved != counts["router-c"] {
		t.Fatal("miscounted")
	}
	if rendezvous(nil, "x") != "" {
		t.Fatal("owner with no members")
	}
}

func TestViewScraperAndMembers(t *testing.T) {
	v := &View{self: "b", members: []string{"a", "b", "c"}}
	m := v.Members()
	m[0] = "zzz"
	if v.Members()[0] != "a" {
		t.Fatal("Members exposes the View's slice")
	}
	if s := v.Scraper("gpu-1"); s != rendezvous([]string{"c", "a", "b"}, "gpu-1") {
		t.Fatalf("scraper %s", s)
	}
}
