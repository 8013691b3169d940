package gpusim

// kvBlock is a cached KV block: one whose content hash is known and that a
// later request with the same prefix can reuse.
type kvBlock struct {
	hash uint64
	// ref counts the running requests holding the block. At 0 the block
	// sits in the LRU free queue: still cached, but evictable.
	ref        int32
	prev, next *kvBlock
}

// kvPool models vLLM's block pool with prefix caching: capacity blocks of
// which some are held anonymously by running requests (partial prompt
// blocks, output blocks, prompt blocks not yet computed), some are cached
// and held, some are cached and free (LRU queue), and the rest are empty.
// Allocation takes empty blocks first, then evicts the least recently
// freed cached block. Not safe for concurrent use: the engine owns it.
type kvPool struct {
	capacity int
	anon     int // blocks held by requests, not in the cache
	held     int // cached blocks with ref > 0
	cached   map[uint64]*kvBlock
	// LRU free queue of cached blocks with ref == 0: head is evicted first.
	head, tail *kvBlock
	lruLen     int
	spare      []*kvBlock // recycled kvBlock structs
	evictions  uint64
}

func newKVPool(capacity int) *kvPool {
	return &kvPool{capacity: capacity, cached: make(map[uint64]*kvBlock)}
}

// empty is the number of blocks neither held nor cached.
func (p *kvPool) empty() int { return p.capacity - p.anon - len(p.cached) }

// used is the number of blocks held by running requests (vLLM's
// kv_cache_usage counts cached-but-free blocks as free).
func (p *kvPool) used() int { return p.anon + p.held }

// usage is used/capacity in [0, 1].
func (p *kvPool) usage() float64 { return min(1, float64(p.used())/float64(p.capacity)) }

// longestPrefix returns how many leading hashes are cached, at most limit.
func (p *kvPool) longestPrefix(hashes []uint64, limit int) int {
	n := 0
	for n < limit && n < len(hashes) {
		if _, ok := p.cached[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// canAllocate reports whether need new blocks fit once the hit blocks
// (cached, about to be acquired) are taken out of the free queue.
func (p *kvPool) canAllocate(need int, hits []uint64) bool {
	evictable := p.lruLen
	for _, h := range hits {
		if p.cached[h].ref == 0 {
			evictable--
		}
	}
	return p.empty()+evictable >= need
}

// acquire takes a reference on each cached block in hashes (which must all
// be cached) and appends them to dst.
func (p *kvPool) acquire(dst []*kvBlock, hashes []uint64) []*kvBlock {
	for _, h := range hashes {
		b := p.cached[h]
		if b.ref == 0 {
			p.unlink(b)
			p.held++
		}
		b.ref++
		dst = append(dst, b)
	}
	return dst
}

// allocate takes up to n anonymous blocks, evicting cached free blocks as
// needed, and returns how many it took (n unless the pool is exhausted).
func (p *kvPool) allocate(n int) int {
	took := 0
	for took < n {
		if p.empty() == 0 && !p.evictOne() {
			break
		}
		p.anon++
		took++
	}
	return took
}

// promote turns one anonymous block holding a just-computed prompt block
// into a cached block held by the caller. It returns nil (the block stays
// anonymous) when that hash is already cached by another request.
func (p *kvPool) promote(hash uint64) *kvBlock {
	if _, ok := p.cached[hash]; ok {
		return nil
	}
	var b *kvBlock
	if n := len(p.spare); n > 0 {
		b, p.spare = p.spare[n-1], p.spare[:n-1]
		*b = kvBlock{}
	} else {
		b = new(kvBlock)
	}
	b.hash, b.ref = hash, 1
	p.cached[hash] = b
	p.anon--
	p.held++
	return b
}

// release drops a finished request's blocks: anon anonymous ones become
// empty, and each cached one loses a reference, joining the LRU free queue
// at 0. Blocks are released last first, so a prefix's deeper blocks are
// evicted before its first ones, as in vLLM.
func (p *kvPool) release(blocks []*kvBlock, anon int) {
	p.anon -= anon
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		b.ref--
		if b.ref == 0 {
			p.held--
			p.pushTail(b)
		}
	}
}

// reset evicts every cached block no request holds (vLLM's
// /reset_prefix_cache) and returns how many it dropped.
func (p *kvPool) reset() int {
	n := 0
	for p.evictOne() {
		n++
	}
	return n
}

func (p *kvPool) evictOne() bool {
	b := p.head
	if b == nil {
		return false
	}
	p.unlink(b)
	delete(p.cached, b.hash)
	p.evictions++
	p.spare = append(p.spare, b)
	return true
}

func (p *kvPool) pushTail(b *kvBlock) {
	b.prev, b.next = p.tail, nil
	if p.tail != nil {
		p.tail.next = b
	} else {
		p.head = b
	}
	p.tail = b
	p.lruLen++
}

func (p *kvPool) unlink(b *kvBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next = nil, nil
	p.lruLen--
}
