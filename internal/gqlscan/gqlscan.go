// Package gqlscan reads a GraphQL request just far enough to say what it
// would run: each operation's type (query, mutation or subscription) and
// the names of its root fields, which for a mutation are the changes it
// asks for (createPullRequest, mergePullRequest ...). The egress proxy's
// request rules use it to let a VM's agent read through GitHub's GraphQL
// API and make only the changes the rules list.
//
// It is a parser of executable documents after the GraphQL specification,
// strict where readers might differ: what it cannot read with certainty
// is an error, never a guess, and the caller refuses the request. It
// takes printable ASCII only outside strings, refuses the escaped triple
// quote of block strings, type system definitions, unknown or repeated
// keys in the JSON envelope, and nesting deeper than maxDepth. It does
// not validate a document against a schema: a field it lists may not
// exist, and a fragment's type condition is not checked, so the root
// fields it reports are all those the document could run, and maybe more.
package gqlscan

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"
)

// Operation types.
const (
	Query        = "query"
	Mutation     = "mutation"
	Subscription = "subscription"
)

// Operation is one operation definition of a document.
type Operation struct {
	Type string // Query, Mutation or Subscription
	Name string // "" for an anonymous operation
	// Fields are the names of its root fields (a field's name, not its
	// alias), those of the fragments spread or inlined at its root
	// included, each once, in order.
	Fields []string
}

// maxDepth bounds the nesting of selection sets, lists, input objects
// and list types.
const maxDepth = 128

// Scan reads a GraphQL document and returns its operations in order.
func Scan(doc string) ([]Operation, error) {
	if !utf8.ValidString(doc) {
		return nil, errors.New("the document is not UTF-8")
	}
	p := &parser{lx: lexer{src: doc}, fragments: map[string]*root{}}
	if err := p.advance(); err != nil {
		return nil, err
	}
	var ops []Operation
	var roots []*root
	for p.tok.kind != eof {
		switch {
		case p.is("{"):
			r := &root{}
			if err := p.selectionSet(r); err != nil {
				return nil, err
			}
			ops, roots = append(ops, Operation{Type: Query}), append(roots, r)
		case p.tok.kind == name && (p.tok.text == Query || p.tok.text == Mutation || p.tok.text == Subscription):
			op, r, err := p.operation()
			if err != nil {
				return nil, err
			}
			ops, roots = append(ops, op), append(roots, r)
		case p.tok.kind == name && p.tok.text == "fragment":
			if err := p.fragment(); err != nil {
				return nil, err
			}
		default:
			return nil, p.errorf("%s where an operation or a fragment begins", p.describe())
		}
	}
	if len(ops) == 0 {
		return nil, errors.New("the document has no operation")
	}
	for i, r := range roots {
		fields, err := p.resolve(r, nil)
		if err != nil {
			return nil, err
		}
		ops[i].Fields = fields
	}
	return ops, nil
}

// root gathers what a selection set at an operation's root (or a
// fragment's) selects: fields, and the fragments it spreads.
type root struct {
	fields  []string
	spreads []string
}

// resolve is r's fields with those of the fragments it spreads, each
// once; seen are the fragments being resolved (a cycle is an error).
func (p *parser) resolve(r *root, seen []string) ([]string, error) {
	var out []string
	add := func(f string) {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for _, f := range r.fields {
		add(f)
	}
	for _, s := range r.spreads {
		if slices.Contains(seen, s) {
			return nil, fmt.Errorf("fragment %s spreads itself", s)
		}
		fr, ok := p.fragments[s]
		if !ok {
			return nil, fmt.Errorf("fragment %s is spread but not defined", s)
		}
		fields, err := p.resolve(fr, append(seen, s))
		if err != nil {
			return nil, err
		}
		for _, f := range fields {
			add(f)
		}
	}
	return out, nil
}

type parser struct {
	lx        lexer
	tok       token
	depth     int
	fragments map[string]*root
}

func (p *parser) advance() error {
	t, err := p.lx.next()
	p.tok = t
	return err
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("at offset %d: %s", p.tok.pos, fmt.Sprintf(format, args...))
}

// describe names the current token for an error.
func (p *parser) describe() string {
	switch p.tok.kind {
	case eof:
		return "the end of the document"
	case str:
		return "a string"
	}
	return fmt.Sprintf("%q", p.tok.text)
}

// is reports whether the current token is the punctuator s.
func (p *parser) is(s string) bool { return p.tok.kind == punct && p.tok.text == s }

func (p *parser) expect(s string) error {
	if !p.is(s) {
		return p.errorf("%s where %q belongs", p.describe(), s)
	}
	return p.advance()
}

func (p *parser) name() (string, error) {
	if p.tok.kind != name {
		return "", p.errorf("%s where a name belongs", p.describe())
	}
	n := p.tok.text
	return n, p.advance()
}

// enter and leave count nesting.
func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return p.errorf("nested deeper than %d", maxDepth)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

// operation reads OperationType Name? VariableDefinitions? Directives?
// SelectionSet.
func (p *parser) operation() (Operation, *root, error) {
	op := Operation{Type: p.tok.text}
	if err := p.advance(); err != nil {
		return op, nil, err
	}
	if p.tok.kind == name {
		op.Name = p.tok.text
		if err := p.advance(); err != nil {
			return op, nil, err
		}
	}
	if p.is("(") {
		if err := p.variableDefinitions(); err != nil {
			return op, nil, err
		}
	}
	if err := p.directives(false); err != nil {
		return op, nil, err
	}
	r := &root{}
	return op, r, p.selectionSet(r)
}

// fragment reads fragment Name on Type Directives? SelectionSet.
func (p *parser) fragment() error {
	if err := p.advance(); err != nil {
		return err
	}
	n, err := p.fragmentName()
	if err != nil {
		return err
	}
	if _, dup := p.fragments[n]; dup {
		return p.errorf("fragment %s is defined twice", n)
	}
	if p.tok.kind != name || p.tok.text != "on" {
		return p.errorf("%s where fragment %s's type condition (on Type) belongs", p.describe(), n)
	}
	r := &root{}
	p.fragments[n] = r
	return p.fragmentBody(r)
}

// fragmentBody reads what follows a fragment's name, or an inline
// fragment's "...": TypeCondition? Directives? SelectionSet.
func (p *parser) fragmentBody(r *root) error {
	if p.tok.kind == name && p.tok.text == "on" {
		if err := p.advance(); err != nil {
			return err
		}
		if _, err := p.name(); err != nil {
			return err
		}
	}
	if err := p.directives(false); err != nil {
		return err
	}
	return p.selectionSet(r)
}

func (p *parser) fragmentName() (string, error) {
	if p.tok.kind == name && p.tok.text == "on" {
		return "", p.errorf(`"on" where a fragment's name belongs`)
	}
	return p.name()
}

// selectionSet reads { Selection+ }. With r, the set is at a root: its
// fields and spreads are gathered in r, and so are those of the inline
// fragments in it.
func (p *parser) selectionSet(r *root) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.leave()
	if err := p.expect("{"); err != nil {
		return err
	}
	if p.is("}") {
		return p.errorf("an empty selection set")
	}
	for !p.is("}") {
		if err := p.selection(r); err != nil {
			return err
		}
	}
	return p.advance()
}

// selection reads a field (Alias? Name Arguments? Directives?
// SelectionSet?), a fragment spread (... Name Directives?) or an inline
// fragment (... TypeCondition? Directives? SelectionSet).
func (p *parser) selection(r *root) error {
	if p.is("...") {
		if err := p.advance(); err != nil {
			return err
		}
		if p.tok.kind == name && p.tok.text != "on" {
			if r != nil {
				r.spreads = append(r.spreads, p.tok.text)
			}
			if err := p.advance(); err != nil {
				return err
			}
			return p.directives(false)
		}
		return p.fragmentBody(r)
	}
	field, err := p.name()
	if err != nil {
		return err
	}
	if p.is(":") { // what came first was the alias
		if err := p.advance(); err != nil {
			return err
		}
		if field, err = p.name(); err != nil {
			return err
		}
	}
	if r != nil {
		r.fields = append(r.fields, field)
	}
	if p.is("(") {
		if err := p.arguments(false); err != nil {
			return err
		}
	}
	if err := p.directives(false); err != nil {
		return err
	}
	if p.is("{") {
		return p.selectionSet(nil)
	}
	return nil
}

// arguments reads ( (Name : Value)+ ).
func (p *parser) arguments(constant bool) error {
	if err := p.expect("("); err != nil {
		return err
	}
	if p.is(")") {
		return p.errorf("empty arguments")
	}
	for !p.is(")") {
		if _, err := p.name(); err != nil {
			return err
		}
		if err := p.expect(":"); err != nil {
			return err
		}
		if err := p.value(constant); err != nil {
			return err
		}
	}
	return p.advance()
}

// directives reads (@ Name Arguments?)*.
func (p *parser) directives(constant bool) error {
	for p.is("@") {
		if err := p.advance(); err != nil {
			return err
		}
		if _, err := p.name(); err != nil {
			return err
		}
		if p.is("(") {
			if err := p.arguments(constant); err != nil {
				return err
			}
		}
	}
	return nil
}

// variableDefinitions reads ( ($ Name : Type DefaultValue? Directives?)+ ).
func (p *parser) variableDefinitions() error {
	if err := p.expect("("); err != nil {
		return err
	}
	if p.is(")") {
		return p.errorf("empty variable definitions")
	}
	for !p.is(")") {
		if err := p.expect("$"); err != nil {
			return err
		}
		if _, err := p.name(); err != nil {
			return err
		}
		if err := p.expect(":"); err != nil {
			return err
		}
		if err := p.typeRef(); err != nil {
			return err
		}
		if p.is("=") {
			if err := p.advance(); err != nil {
				return err
			}
			if err := p.value(true); err != nil {
				return err
			}
		}
		if err := p.directives(true); err != nil {
			return err
		}
	}
	return p.advance()
}

// typeRef reads Name, [Type], either followed by an optional !.
func (p *parser) typeRef() error {
	if p.is("[") {
		if err := p.enter(); err != nil {
			return err
		}
		if err := p.advance(); err != nil {
			return err
		}
		if err := p.typeRef(); err != nil {
			return err
		}
		if err := p.expect("]"); err != nil {
			return err
		}
		p.leave()
	} else if _, err := p.name(); err != nil {
		return err
	}
	if p.is("!") {
		return p.advance()
	}
	return nil
}

// value reads a value: a variable (unless constant), a number, a
// string, a name (true, false, null, an enum value), a list or an input
// object.
func (p *parser) value(constant bool) error {
	switch {
	case p.is("$") && !constant:
		if err := p.advance(); err != nil {
			return err
		}
		_, err := p.name()
		return err
	case p.tok.kind == number || p.tok.kind == str || p.tok.kind == name:
		return p.advance()
	case p.is("["):
		return p.nested("]", func() error { return p.value(constant) })
	case p.is("{"):
		return p.nested("}", func() error {
			if _, err := p.name(); err != nil {
				return err
			}
			if err := p.expect(":"); err != nil {
				return err
			}
			return p.value(constant)
		})
	}
	return p.errorf("%s where a value belongs", p.describe())
}

// nested reads an opening punctuator, items until end, and end.
func (p *parser) nested(end string, item func() error) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.leave()
	if err := p.advance(); err != nil {
		return err
	}
	for !p.is(end) {
		if p.tok.kind == eof {
			return p.errorf("the end of the document where %q belongs", end)
		}
		if err := item(); err != nil {
			return err
		}
	}
	return p.advance()
}
