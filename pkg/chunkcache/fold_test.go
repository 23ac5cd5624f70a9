package chunkcache

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"
)

// Chunks folded into a backing file take no disk of their own and are
// still served, right bytes, to the origin that delivered them (also by a
// new process), and not to another; a backing file damaged on disk stops
// serving them; an evicted backing file takes its folded chunks with it.
func TestFoldServesChunksFromBackingFile(t *testing.T) {
	ctx := context.Background()
	f, descs, datas := pushChunks(t, 3, 8192)
	dir := t.TempDir()
	c := mustOpenCache(t, dir).For("reg.example/a")
	desc, _ := fileOf(datas...)
	b, err := c.Assemble(ctx, desc, assembleFrom(c, f, descs))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	pieces := []Piece{{descs[0], 0}, {descs[1], descs[0].Size}, {descs[2], descs[0].Size + descs[1].Size}}
	freed, err := c.Fold(desc, pieces)
	if err != nil || freed != 3*8192 {
		t.Fatalf("Fold: freed %d, err %v; want the 3 chunks' bytes", freed, err)
	}
	for _, d := range descs {
		if _, err := os.Stat(c.path(d.Digest)); err == nil {
			t.Fatalf("chunk %s still has its own entry after the fold", d.Digest)
		}
	}
	f.reset()
	check := func(c *Cache, what string) {
		t.Helper()
		for i, d := range descs {
			if !c.Contains(d.Digest) {
				t.Fatalf("%s: folded chunk %d not contained", what, i)
			}
			if n, ok := c.EntrySize(d.Digest); !ok || n != d.Size {
				t.Fatalf("%s: EntrySize %d %v", what, n, ok)
			}
			ch, err := c.Load(ctx, f, d)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(io.NewSectionReader(ch, 0, d.Size))
			ch.Close()
			if err != nil || !bytes.Equal(got, datas[i]) {
				t.Fatalf("%s: folded chunk %d: wrong bytes (%v)", what, i, err)
			}
		}
		if n, _ := f.total(); n != 0 {
			t.Fatalf("%s: %d fetches for folded chunks", what, n)
		}
	}
	check(c, "this process")
	again := mustOpenCache(t, dir)
	check(again.For("reg.example/a"), "a new process")
	if other := again.For("reg.example/b"); other.Contains(descs[0].Digest) {
		t.Fatal("a folded chunk is served to an origin that never delivered it")
	}

	// Damage the backing file: its mark no longer matches, it is hashed,
	// found wrong and dropped with its folded chunks; the chunk is fetched.
	bp := c.backingPath(desc.Digest)
	fh, err := os.OpenFile(bp, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteAt([]byte{0xff ^ datas[1][5]}, descs[0].Size+5)
	fh.Close()
	os.Chtimes(bp, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	fresh := mustOpenCache(t, dir).For("reg.example/a")
	ch, err := fresh.Load(ctx, f, descs[1])
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(io.NewSectionReader(ch, 0, descs[1].Size))
	ch.Close()
	if !bytes.Equal(got, datas[1]) {
		t.Fatal("a chunk folded into a damaged backing file was served with its bytes")
	}
	if n, _ := f.total(); n != 1 {
		t.Fatalf("%d fetches, want the damaged chunk fetched once", n)
	}
	if _, err := os.Stat(bp); err == nil {
		t.Fatal("the damaged backing file is still there")
	}
	if fresh.Contains(descs[2].Digest) {
		t.Fatal("a chunk folded into a removed backing file still counts as cached")
	}
}

// Evicting a backing file drops the chunks folded into it; while an owner
// protects one of them, the backing file is evicted only after the
// unprotected entries.
func TestFoldEviction(t *testing.T) {
	ctx := context.Background()
	f, all, alldatas := pushChunks(t, 3, 8192)
	descs, datas := all[:2], alldatas[:2]
	dir := t.TempDir()
	c := mustOpenCache(t, dir)
	desc, _ := fileOf(datas...)
	b, err := c.Assemble(ctx, desc, assembleFrom(c, f, descs))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := c.Fold(desc, []Piece{{descs[0], 0}, {descs[1], descs[0].Size}}); err != nil {
		t.Fatal(err)
	}
	ch, err := c.Load(ctx, f, all[2]) // an unprotected chunk, used after the backing file
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	c.Protect("mount", descs[:1])
	c.mu.Lock()
	c.max = desc.Size // over the bound by the unprotected chunk
	c.evictLocked(nil)
	c.mu.Unlock()
	if !c.Contains(descs[0].Digest) {
		t.Fatal("the backing file holding a protected folded chunk was evicted before an unprotected chunk")
	}
	if c.Contains(all[2].Digest) {
		t.Fatal("premise: the unprotected chunk was not evicted")
	}
	c.Unprotect("mount")
	c.mu.Lock()
	c.max = 1
	c.evictLocked(nil)
	c.mu.Unlock()
	for _, d := range descs {
		if c.Contains(d.Digest) {
			t.Fatal("a chunk folded into an evicted backing file still counts as cached")
		}
		if _, err := os.Stat(c.foldPath(d.Digest)); err == nil {
			t.Fatal("a folded entry outlived its backing file")
		}
	}
}

// Removing a folded chunk removes the backing file it was folded into:
// the chunk's bytes leave the disk, as a chunk entry's do.
func TestRemoveFoldedChunkFreesItsDisk(t *testing.T) {
	ctx := context.Background()
	f, descs, datas := pushChunks(t, 2, 8192)
	c := mustOpenCache(t, t.TempDir())
	desc, _ := fileOf(datas...)
	b, err := c.Assemble(ctx, desc, assembleFrom(c, f, descs))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := c.Fold(desc, []Piece{{descs[0], 0}, {descs[1], descs[0].Size}}); err != nil {
		t.Fatal(err)
	}
	if !c.Remove(descs[0].Digest) {
		t.Fatal("Remove of a folded chunk reported nothing removed")
	}
	if _, err := os.Stat(c.backingPath(desc.Digest)); err == nil {
		t.Fatal("the backing file holding the removed chunk's bytes is still on disk")
	}
	if c.Contains(descs[0].Digest) || c.Contains(descs[1].Digest) {
		t.Fatal("chunks folded into the removed backing file still count as cached")
	}
	if n := c.Size(); n != 0 {
		t.Fatalf("the cache accounts %d bytes after the removal, want 0", n)
	}
}

// Serving a folded chunk leaves its backing file's vouch mark valid: the
// next open of the file (or of another chunk in it) does not hash the
// whole file again.
func TestFoldedLoadKeepsTheMark(t *testing.T) {
	ctx := context.Background()
	f, descs, datas := pushChunks(t, 2, 8192)
	dir := t.TempDir()
	c := mustOpenCache(t, dir)
	desc, _ := fileOf(datas...)
	b, err := c.Assemble(ctx, desc, assembleFrom(c, f, descs))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := c.Fold(desc, []Piece{{descs[0], 0}, {descs[1], descs[0].Size}}); err != nil {
		t.Fatal(err)
	}
	ch, err := mustOpenCache(t, dir).Load(ctx, f, descs[0])
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	bf, err := os.Open(c.backingPath(desc.Digest))
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	st, err := bf.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if !vouchedEntry(bf, st) {
		t.Fatal("loading a folded chunk voided its backing file's mark: the next open hashes the whole file")
	}
}
