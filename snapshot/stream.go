// Package snapshot moves a member's state to another member as a raft
// snapshot: the leader streams every key of a consistent engine view, the
// follower writes them into one table and installs it atomically (see
// engine/pebble, InstallSnapshot). When the leader's compacted raft log
// covers the member's gap, it may send those batches instead, in the
// incremental stream of incremental.go (FORMAT.md, "Incremental snapshot
// stream"); the first 8 bytes tell the two apart (Kind).
//
// # Stream format (version 1)
//
// All integers are unsigned varints unless said otherwise.
//
//	header:  magic "STRATASN" (8 bytes) | version (1 byte, = 1) | applied index (8 bytes, big-endian)
//	record:  key length K (> 0) | value length V | key (K bytes) | value (V bytes)
//	trailer: a zero byte (a key length of 0 ends the records) | record count | CRC-32C (4 bytes, big-endian)
//
// The CRC-32C covers every byte from the start of the header to the record
// count included. Keys arrive in strictly increasing order; the receiver
// checks it (the table writer would refuse otherwise). A key is at most
// 64 KiB and a value at most 256 MiB, so a corrupt length never forces a
// large allocation before the bytes behind it are read. Nothing the
// receiver wrote is installed unless the trailer checks out.
//
// Concurrency: Write and Read each use one goroutine; different streams are
// independent.
package snapshot

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

const (
	magic   = "STRATASN"
	version = 1
	// MaxKeySize and MaxValueSize bound what a stream may carry.
	MaxKeySize   = 64 << 10
	MaxValueSize = 256 << 20
)

// ErrCorrupt marks a stream that does not decode or whose checksum fails.
var ErrCorrupt = errors.New("snapshot: corrupt stream")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sink receives a snapshot's records in order: the engine's SnapshotWriter.
type Sink interface {
	Add(key, value []byte) error
}

// Write streams a snapshot to w: the applied index the view holds, then
// every record forEach produces, in key order.
func Write(w io.Writer, appliedIndex uint64, forEach func(fn func(key, value []byte) error) error) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	crc := crc32.New(castagnoli)
	out := io.MultiWriter(bw, crc)
	var hdr [17]byte
	copy(hdr[:8], magic)
	hdr[8] = version
	binary.BigEndian.PutUint64(hdr[9:], appliedIndex)
	if _, err := out.Write(hdr[:]); err != nil {
		return err
	}
	var count uint64
	var scratch [2 * binary.MaxVarintLen64]byte
	err := forEach(func(key, value []byte) error {
		if len(key) == 0 || len(key) > MaxKeySize || len(value) > MaxValueSize {
			return fmt.Errorf("snapshot: key of %d bytes or value of %d bytes out of bounds", len(key), len(value))
		}
		n := binary.PutUvarint(scratch[:], uint64(len(key)))
		n += binary.PutUvarint(scratch[n:], uint64(len(value)))
		if _, err := out.Write(scratch[:n]); err != nil {
			return err
		}
		if _, err := out.Write(key); err != nil {
			return err
		}
		if _, err := out.Write(value); err != nil {
			return err
		}
		count++
		return nil
	})
	if err != nil {
		return err
	}
	n := binary.PutUvarint(scratch[:], 0)
	n += binary.PutUvarint(scratch[n:], count)
	if _, err := out.Write(scratch[:n]); err != nil {
		return err
	}
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc.Sum32())
	if _, err := bw.Write(sum[:]); err != nil {
		return err
	}
	return bw.Flush()
}

// errAboveLimit stops Size's walk.
var errAboveLimit = errors.New("snapshot: stream above the limit")

// Size returns the length of the stream Write would produce for the
// records forEach produces, without producing it. It stops walking once
// the length is above limit (then it returns a length above limit, not
// the whole length): a leader weighing an incremental snapshot against a
// full one reads no more of its engine than the incremental one's size.
func Size(forEach func(fn func(key, value []byte) error) error, limit int64) (int64, error) {
	n := int64(17) // header
	var count uint64
	err := forEach(func(key, value []byte) error {
		n += int64(uvarintLen(uint64(len(key))) + uvarintLen(uint64(len(value))) + len(key) + len(value))
		count++
		if n > limit {
			return errAboveLimit
		}
		return nil
	})
	if errors.Is(err, errAboveLimit) {
		return n, nil
	}
	if err != nil {
		return 0, err
	}
	return n + int64(1+uvarintLen(count)+4), nil
}

func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// crcReader checksums what it reads.
type crcReader struct {
	r   *bufio.Reader
	crc hash.Hash32
}

func (c *crcReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.crc.Write([]byte{b})
	}
	return b, err
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.crc.Write(p[:n])
	return n, err
}

// Read decodes a snapshot stream from r into sink and returns the applied
// index it carries. Any damage is an error wrapping ErrCorrupt.
func Read(r io.Reader, sink Sink) (appliedIndex uint64, records uint64, err error) {
	cr := &crcReader{r: bufio.NewReaderSize(r, 1<<20), crc: crc32.New(castagnoli)}
	var hdr [17]byte
	if _, err := io.ReadFull(cr, hdr[:]); err != nil {
		return 0, 0, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if string(hdr[:8]) != magic {
		return 0, 0, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	if hdr[8] != version {
		return 0, 0, fmt.Errorf("%w: unknown version %d", ErrCorrupt, hdr[8])
	}
	appliedIndex = binary.BigEndian.Uint64(hdr[9:])
	var prev, key, value []byte
	for {
		klen, err := binary.ReadUvarint(cr)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: record %d: %v", ErrCorrupt, records, err)
		}
		if klen == 0 {
			break
		}
		vlen, err := binary.ReadUvarint(cr)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: record %d: %v", ErrCorrupt, records, err)
		}
		if klen > MaxKeySize || vlen > MaxValueSize {
			return 0, 0, fmt.Errorf("%w: record %d: key of %d bytes or value of %d bytes out of bounds", ErrCorrupt, records, klen, vlen)
		}
		key = grow(key, int(klen))
		value = grow(value, int(vlen))
		if _, err := io.ReadFull(cr, key); err != nil {
			return 0, 0, fmt.Errorf("%w: record %d: %v", ErrCorrupt, records, err)
		}
		if _, err := io.ReadFull(cr, value); err != nil {
			return 0, 0, fmt.Errorf("%w: record %d: %v", ErrCorrupt, records, err)
		}
		if records > 0 && bytes.Compare(prev, key) >= 0 {
			return 0, 0, fmt.Errorf("%w: record %d: keys out of order", ErrCorrupt, records)
		}
		if err := sink.Add(key, value); err != nil {
			return 0, 0, err
		}
		prev = append(prev[:0], key...)
		records++
	}
	count, err := binary.ReadUvarint(cr)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: trailer: %v", ErrCorrupt, err)
	}
	want := cr.crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(cr.r, sum[:]); err != nil {
		return 0, 0, fmt.Errorf("%w: checksum: %v", ErrCorrupt, err)
	}
	if count != records {
		return 0, 0, fmt.Errorf("%w: trailer counts %d records, stream held %d", ErrCorrupt, count, records)
	}
	if binary.BigEndian.Uint32(sum[:]) != want {
		return 0, 0, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return appliedIndex, records, nil
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
