package appendlog

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strings"

	"go.uber.org/zap"
)

// Hint files (Bitcask's): for a sealed data file, the effect of replaying
// it on the key directory, which recovery reads instead of the file's
// every byte. FORMAT.md, Hint files, is the byte format.

const (
	hintMagic     = "STRHINT1"
	hintSuffix    = ".hint"
	hintHeadSize  = 8 + 8 + headerSize + 8 + 8 // magic, id, data header, size, dead
	hintTrailSize = 4                          // CRC
)

// errBadHint marks a hint file recovery must not use; it then scans the
// data file instead.
var errBadHint = errors.New("unusable hint file")

// hintEntry is one key's last record in a data file: a set with its
// value's location, or a deletion.
type hintEntry struct {
	key []byte
	del bool
	off int64
	n   uint32
}

// hint is a decoded hint file.
type hint struct {
	id      uint64
	dataHdr [headerSize]byte // the data file's header, byte for byte
	size    int64            // the data file's length
	dead    int64            // bytes of the file's records overwritten within it
	entries []hintEntry
}

// hintPath is the hint file of the data file at path.
func hintPath(dataPath string) string {
	return strings.TrimSuffix(dataPath, fileSuffix) + hintSuffix
}

// parseHintName returns the id of a hint file's name.
func parseHintName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, hintSuffix)
	if !ok {
		return 0, false
	}
	return parseFileName(base + fileSuffix)
}

// encode returns the hint file's bytes.
func (h *hint) encode() []byte {
	n := hintHeadSize + hintTrailSize
	for _, en := range h.entries {
		n += 1 + 3*binary.MaxVarintLen64 + len(en.key)
	}
	b := make([]byte, 0, n)
	b = append(b, hintMagic...)
	b = binary.BigEndian.AppendUint64(b, h.id)
	b = append(b, h.dataHdr[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(h.size))
	b = binary.BigEndian.AppendUint64(b, uint64(h.dead))
	for _, en := range h.entries {
		if en.del {
			b = append(b, kindDelete)
			b = binary.AppendUvarint(b, uint64(len(en.key)))
			b = append(b, en.key...)
			continue
		}
		b = append(b, kindSet)
		b = binary.AppendUvarint(b, uint64(len(en.key)))
		b = append(b, en.key...)
		b = binary.AppendUvarint(b, uint64(en.off))
		b = binary.AppendUvarint(b, uint64(en.n))
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeHint decodes and checks a hint file: its CRC, and that every entry
// is well formed and points inside the data file it names (FORMAT.md).
// Keys are copies, not slices of b.
func decodeHint(b []byte) (*hint, error) {
	if len(b) < hintHeadSize+hintTrailSize {
		return nil, fmt.Errorf("%w: %d bytes", errBadHint, len(b))
	}
	body := b[:len(b)-hintTrailSize]
	if got, want := binary.BigEndian.Uint32(b[len(body):]), crc32.Checksum(body, castagnoli); got != want {
		return nil, fmt.Errorf("%w: CRC %08x, computed %08x", errBadHint, got, want)
	}
	if string(body[:8]) != hintMagic {
		return nil, fmt.Errorf("%w: magic %q", errBadHint, body[:8])
	}
	h := &hint{id: binary.BigEndian.Uint64(body[8:16])}
	copy(h.dataHdr[:], body[16:16+headerSize])
	p := 16 + headerSize
	size, dead := binary.BigEndian.Uint64(body[p:]), binary.BigEndian.Uint64(body[p+8:])
	if size < headerSize || size > 1<<62 || dead > size {
		return nil, fmt.Errorf("%w: size %d, dead %d", errBadHint, size, dead)
	}
	h.size, h.dead = int64(size), int64(dead)
	p += 16
	for p < len(body) {
		kind := body[p]
		p++
		klen, n := binary.Uvarint(body[p:])
		if n <= 0 || klen == 0 || klen > maxKeySize || uint64(len(body)-p-n) < klen {
			return nil, fmt.Errorf("%w: entry at %d: bad key length", errBadHint, p)
		}
		p += n
		en := hintEntry{key: bytes.Clone(body[p : p+int(klen)])}
		p += int(klen)
		switch kind {
		case kindDelete:
			en.del = true
		case kindSet:
			off, n := binary.Uvarint(body[p:])
			if n <= 0 {
				return nil, fmt.Errorf("%w: entry at %d: bad offset", errBadHint, p)
			}
			p += n
			vlen, n := binary.Uvarint(body[p:])
			if n <= 0 || vlen > maxFrame || off < headerSize || off > size || size-off < vlen {
				return nil, fmt.Errorf("%w: entry at %d: value of %d bytes at %d outside the file's %d", errBadHint, p, vlen, off, size)
			}
			p += n
			en.off, en.n = int64(off), uint32(vlen)
		default:
			return nil, fmt.Errorf("%w: entry at %d: kind %d", errBadHint, p-1, kind)
		}
		h.entries = append(h.entries, en)
	}
	return h, nil
}

// buildHint reads every frame of the sealed file s and returns its hint:
// each key's last record, in key order, and the bytes of the file's own
// records that later records of the file overwrote or deleted (the share
// of s.dead that replay counts within the file).
func buildHint(s *segment) (*hint, error) {
	h := &hint{id: s.id, size: s.size}
	copy(h.dataHdr[:], s.hdr.encode())
	last := map[string]int{} // key -> index in h.entries
	fr := &frameReader{r: bufio.NewReaderSize(io.NewSectionReader(s.f, headerSize, s.size-headerSize), 1<<20), off: headerSize}
	for {
		_, frame, start, err := fr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.path, err)
		}
		err = decodeRecords(frame, func(r record) error {
			en := hintEntry{del: r.del}
			if !r.del {
				en.off, en.n = start+int64(r.valueOff), uint32(len(r.value))
			}
			if i, ok := last[string(r.key)]; ok {
				if old := h.entries[i]; !old.del {
					h.dead += int64(old.n) + int64(len(r.key))
				}
				en.key = h.entries[i].key
				h.entries[i] = en
				return nil
			}
			en.key = bytes.Clone(r.key)
			last[string(en.key)] = len(h.entries)
			h.entries = append(h.entries, en)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: frame at %d: %w", s.path, start, err)
		}
	}
	if fr.off != s.size {
		return nil, fmt.Errorf("%s: frames end at %d of %d bytes", s.path, fr.off, s.size)
	}
	slices.SortFunc(h.entries, func(a, b hintEntry) int { return bytes.Compare(a.key, b.key) })
	return h, nil
}

// writeHint writes h as the hint file of s: under a temporary name,
// synced, renamed into place, directory synced (a power cut leaves the
// whole hint or none). It returns the file's length.
func writeHint(dir string, s *segment, h *hint) (int64, error) {
	path := hintPath(s.path)
	b := h.encode()
	f, err := os.OpenFile(path+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", path+tmpSuffix, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(path+tmpSuffix, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(path + tmpSuffix)
		return 0, fmt.Errorf("write hint %s: %w", path, err)
	}
	return int64(len(b)), nil
}

// loadHint reads the hint file of s, if there is one that describes s as
// it is on disk: its id, its header byte for byte and its length. It
// returns errBadHint (wrapped) for a hint that is damaged or describes
// another file, os.ErrNotExist when there is none.
func loadHint(s *segment) (*hint, int64, error) {
	b, err := os.ReadFile(hintPath(s.path))
	if err != nil {
		return nil, 0, err
	}
	h, err := decodeHint(b)
	if err != nil {
		return nil, 0, err
	}
	if h.id != s.id || !bytes.Equal(h.dataHdr[:], s.hdr.encode()) || h.size != s.size {
		return nil, 0, fmt.Errorf("%w: it describes file %x of %d bytes, not this one (%x, %d bytes)", errBadHint, h.id, h.size, s.id, s.size)
	}
	return h, int64(len(b)), nil
}

// applyHint applies h to kd as replay(s) would: each entry is its key's
// last record in s, and the dead bytes replay counts are the same (those
// of older files as entries replace or delete their keys, and the file's
// own from the hint).
func applyHint(s *segment, kd *keydir, h *hint) {
	for _, en := range h.entries {
		if en.del {
			if old, ok := deleteKey(kd, en.key); ok {
				old.seg.dead += int64(old.n) + int64(len(en.key))
			}
			continue
		}
		if _, old, ok := kd.ReplaceOrInsert(en.key, loc{seg: s, off: en.off, n: en.n}); ok {
			old.seg.dead += int64(old.n) + int64(len(en.key))
		}
	}
	s.dead += h.dead
}

// hinter writes the hint file of each sealed file of the set that has none
// (after a rotation, a merge, an install, and at Open for the files
// recovery scanned), and on Close a last time, so that a clean Close leaves
// every sealed file with its hint (the active file is sealed by the next
// Open and hinted then).
func (e *Engine) hinter() {
	defer close(e.hintDone)
	for {
		select {
		case <-e.stop:
			e.hintPass()
			return
		case <-e.hintKick:
			e.hintPass()
		}
	}
}

// hintPass writes the hints the set's sealed files lack.
func (e *Engine) hintPass() {
	e.mu.RLock()
	var todo []*segment
	for _, s := range e.mu.segs {
		if s.sealed && !s.hinted && s.size > headerSize {
			s.ref()
			todo = append(todo, s)
		}
	}
	e.mu.RUnlock()
	for _, s := range todo {
		if err := e.hintFile(s); err != nil {
			e.logger.Warn("appendlog: no hint file written; the next Open scans the data file", zap.String("file", s.path), zap.Error(err))
		}
		s.unref()
	}
}

// hintFile writes the hint of the sealed file s. REQUIRES: a reference on s.
func (e *Engine) hintFile(s *segment) error {
	e.hintMu.Lock()
	defer e.hintMu.Unlock()
	if s.obsolete.Load() {
		return nil
	}
	h, err := buildHint(s)
	if err != nil {
		return err
	}
	n, err := writeHint(e.dir, s, h)
	if err != nil {
		return err
	}
	e.mu.Lock()
	s.hinted, s.hintBytes = true, n
	e.mu.Unlock()
	return nil
}

// kickHinter wakes the hinter.
func (e *Engine) kickHinter() {
	select {
	case e.hintKick <- struct{}{}:
	default:
	}
}
