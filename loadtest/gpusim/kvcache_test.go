package gpusim

import "testing"

func TestKVPoolRefCountingAndLRU(t *testing.T) {
	p := newKVPool(4)
	// Request 1 computes blocks a, b (plus one anonymous output block).
	if got := p.allocate(3); got != 3 {
		t.Fatalf("allocate(3) = %d", got)
	}
	a, b := p.promote(1), p.promote(2)
	if a == nil || b == nil {
		t.Fatal("promote returned nil for new hashes")
	}
	if p.promote(1) != nil {
		t.Fatal("promote of an already cached hash must keep the block anonymous")
	}
	if p.used() != 3 || p.usage() != 0.75 {
		t.Fatalf("used %d usage %v, want 3 and 0.75", p.used(), p.usage())
	}
	// Request 2 shares block a while request 1 runs.
	held := p.acquire(nil, []uint64{1})
	if a.ref != 2 {
		t.Fatalf("ref of shared block = %d, want 2", a.ref)
	}
	p.release([]*kvBlock{a, b}, 1) // request 1 ends
	if p.used() != 1 || p.lruLen != 1 || p.head != b {
		t.Fatalf("after release: used %d lru %d; want 1 held block and b free", p.used(), p.lruLen)
	}
	if got := p.longestPrefix([]uint64{1, 2, 3}, 3); got != 2 {
		t.Fatalf("longestPrefix = %d, want 2 (freed blocks stay cached)", got)
	}
	p.release(held, 0) // request 2 ends: a is freed after b, so b is evicted first
	if p.head != b || p.tail != a {
		t.Fatal("LRU order wrong: the block freed first must be evicted first")
	}
	// 2 empty + 2 evictable: allocating 3 evicts exactly one block, b.
	if !p.canAllocate(3, nil) || p.canAllocate(5, nil) {
		t.Fatal("canAllocate disagrees with 2 empty + 2 evictable blocks")
	}
	if got := p.allocate(3); got != 3 {
		t.Fatalf("allocate(3) = %d", got)
	}
	if p.evictions != 1 || p.longestPrefix([]uint64{1}, 1) != 1 || p.longestPrefix([]uint64{2}, 1) != 0 {
		t.Fatalf("evictions %d; want b evicted and a kept", p.evictions)
	}
	// The pool is now 3 anonymous blocks and a (free). A block about to be
	// acquired as a hit is not evictable for the same request.
	if p.canAllocate(1, []uint64{1}) {
		t.Fatal("a hit block was counted as evictable")
	}
	if !p.canAllocate(1, nil) {
		t.Fatal("evicting a must make room for one block")
	}
	if got := p.allocate(5); got != 1 {
		t.Fatalf("allocate past capacity took %d, want the 1 left after evicting a", got)
	}
	if p.used() != 4 || p.usage() != 1 {
		t.Fatalf("used %d usage %v, want a full pool", p.used(), p.usage())
	}
}

func TestKVPoolReset(t *testing.T) {
	p := newKVPool(8)
	p.allocate(3)
	blocks := []*kvBlock{p.promote(10), p.promote(11), p.promote(12)}
	p.release(blocks[1:], 0) // 11 and 12 freed, 10 still held
	if n := p.reset(); n != 2 {
		t.Fatalf("reset evicted %d, want 2", n)
	}
	if len(p.cached) != 1 || p.longestPrefix([]uint64{10}, 1) != 1 {
		t.Fatal("reset must keep blocks that a request holds")
	}
}

func TestShapePromptChainsBlockHashes(t *testing.T) {
	text := make([]byte, 4*16*3+5) // 3 full blocks and a partial one
	for i := range text {
		text[i] = byte('a' + i%26)
	}
	s := shapePrompt(text, 4, 16, "", "")
	if s.tokens != 50 || len(s.hashes) != 3 {
		t.Fatalf("tokens %d blocks %d, want 50 and 3", s.tokens, len(s.hashes))
	}
	// Same second block content after a different first block: different hash.
	other := append([]byte(nil), text...)
	other[0] = 'Z'
	o := shapePrompt(other, 4, 16, "", "")
	for k := range s.hashes {
		if s.hashes[k] == o.hashes[k] {
			t.Fatalf("block %d hash ignores its parent", k)
		}
	}
	// A change in the last block leaves the earlier hashes alone.
	tail := append([]byte(nil), text...)
	tail[4*16*2+1] = 'Z'
	tl := shapePrompt(tail, 4, 16, "", "")
	if tl.hashes[0] != s.hashes[0] || tl.hashes[1] != s.hashes[1] || tl.hashes[2] == s.hashes[2] {
		t.Fatal("a change in block 2 must change only hash 2")
	}
	if salted := shapePrompt(text, 4, 16, "tenant-a", ""); salted.hashes[0] == s.hashes[0] {
		t.Fatal("cache_salt must change the chain")
	}
}

func TestFillerIsDeterministicASCII(t *testing.T) {
	f := newFiller()
	for i := 0; i < 64; i++ {
		if f.words[i] == "" || f.spaced[i] != " "+f.words[i] {
			t.Fatalf("word %d malformed: %q %q", i, f.words[i], f.spaced[i])
		}
		for _, c := range []byte(f.words[i]) {
			if c < 'a' || c > 'z' {
				t.Fatalf("word %q needs JSON escaping", f.words[i])
			}
		}
	}
	if f.token(7, 3) != f.token(7, 3) || f.token(7, 0)[0] == ' ' || f.token(7, 1)[0] != ' ' {
		t.Fatal("filler must be deterministic, first token unspaced, later ones spaced")
	}
}
