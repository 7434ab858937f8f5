package transport

import (
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Field numbers of a frame on the wire (FORMAT.md). They are wire format:
// never renumber them, only add new ones.
const (
	fieldClusterID protowire.Number = 1
	fieldFrom      protowire.Number = 2
	fieldTo        protowire.Number = 3
	fieldMessage   protowire.Number = 4
	fieldChunk     protowire.Number = 5
	fieldLast      protowire.Number = 6
)

// codecName is the gRPC content subtype of the peer service
// ("application/grpc+strata-peer"). It is wire format.
const codecName = "strata-peer"

// errBadFrame is wrapped by every frame decoding error.
var errBadFrame = errors.New("bad peer frame")

// frame is the only message type of the peer service. Which fields are set
// depends on its role (FORMAT.md): a hello carries ClusterID, From and To; a
// batch carries Msgs; a snapshot chunk carries Chunk, and the last one Last.
type frame struct {
	ClusterID uint64
	From, To  uint64
	Msgs      []*raftpb.Message
	Chunk     []byte
	Last      bool
}

// marshal encodes f as a protobuf message. Zero fields are omitted, as
// proto3 does.
func (f *frame) marshal() ([]byte, error) {
	var b []byte
	for _, v := range []struct {
		num protowire.Number
		v   uint64
	}{{fieldClusterID, f.ClusterID}, {fieldFrom, f.From}, {fieldTo, f.To}} {
		if v.v != 0 {
			b = protowire.AppendTag(b, v.num, protowire.VarintType)
			b = protowire.AppendVarint(b, v.v)
		}
	}
	for _, m := range f.Msgs {
		// Messages are length-delimited fields; UseCachedSize reuses the size
		// proto.Size computed so the length prefix costs no second walk.
		n := proto.Size(m)
		b = protowire.AppendTag(b, fieldMessage, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		var err error
		b, err = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
		if err != nil {
			return nil, fmt.Errorf("marshal raft message %s to %x: %w", m.GetType(), m.GetTo(), err)
		}
	}
	if len(f.Chunk) > 0 {
		b = protowire.AppendTag(b, fieldChunk, protowire.BytesType)
		b = protowire.AppendBytes(b, f.Chunk)
	}
	if f.Last {
		b = protowire.AppendTag(b, fieldLast, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	return b, nil
}

// unmarshal decodes b into f, which must be zero. Unknown fields are skipped
// so that a newer peer may add some. f keeps no reference to b: gRPC reuses
// its receive buffers.
func (f *frame) unmarshal(b []byte) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: tag: %w", errBadFrame, protowire.ParseError(n))
		}
		b = b[n:]
		want := protowire.VarintType
		switch num {
		case fieldMessage, fieldChunk:
			want = protowire.BytesType
		case fieldClusterID, fieldFrom, fieldTo, fieldLast:
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("%w: unknown field %d: %w", errBadFrame, num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		if typ != want {
			return fmt.Errorf("%w: field %d has wire type %d, want %d", errBadFrame, num, typ, want)
		}
		if want == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return fmt.Errorf("%w: field %d: %w", errBadFrame, num, protowire.ParseError(n))
			}
			b = b[n:]
			switch num {
			case fieldClusterID:
				f.ClusterID = v
			case fieldFrom:
				f.From = v
			case fieldTo:
				f.To = v
			case fieldLast:
				f.Last = v != 0
			}
			continue
		}
		// ConsumeBytes checks the length against what is left before
		// slicing, so a corrupt length cannot force an allocation.
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("%w: field %d: %w", errBadFrame, num, protowire.ParseError(n))
		}
		b = b[n:]
		if num == fieldChunk {
			// A repeated scalar field replaces the earlier value, as
			// protobuf decoders do.
			f.Chunk = append([]byte(nil), v...)
			continue
		}
		m := new(raftpb.Message)
		// proto.Unmarshal copies bytes fields, so m does not alias b.
		if err := proto.Unmarshal(v, m); err != nil {
			return fmt.Errorf("%w: raft message %d: %w", errBadFrame, len(f.Msgs), err)
		}
		f.Msgs = append(f.Msgs, m)
	}
	return nil
}

// codec lets gRPC carry frames. It is registered under codecName, so both
// sides pick it from the content subtype without touching the server's
// default (protobuf) codec, which the etcd services on the same gRPC server
// keep using.
type codec struct{}

func init() { encoding.RegisterCodec(codec{}) }

// Marshal implements encoding.Codec.
func (codec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("peer codec: cannot marshal %T", v)
	}
	return f.marshal()
}

// Unmarshal implements encoding.Codec.
func (codec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("peer codec: cannot unmarshal into %T", v)
	}
	*f = frame{}
	return f.unmarshal(data)
}

// Name implements encoding.Codec.
func (codec) Name() string { return codecName }
