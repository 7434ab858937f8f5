package auth

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
)

// Flags are etcd's auth flags.
type Flags struct {
	// Token is --auth-token: "simple" (default) or
	// "jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256[,ttl=5m]".
	Token string
	// TokenTTL is --auth-token-ttl for simple tokens (0: 300 s).
	TokenTTL time.Duration
	// BcryptCost is --bcrypt-cost (0: bcrypt's default, 10).
	BcryptCost int
}

// Open checks flags as etcd does and returns the store over what r holds.
func Open(flags Flags, r engine.Reader, logger *zap.Logger) (*Store, error) {
	tokens, err := ParseTokenOptions(flags.Token, flags.TokenTTL)
	if err != nil {
		return nil, err
	}
	if flags.BcryptCost != 0 {
		if err := ValidateBcryptCost(flags.BcryptCost); err != nil {
			return nil, fmt.Errorf("--bcrypt-cost: %w", err)
		}
	}
	s := New(Options{BcryptCost: flags.BcryptCost, Tokens: tokens, Logger: logger})
	if err := s.Load(r); err != nil {
		return nil, err
	}
	return s, nil
}
