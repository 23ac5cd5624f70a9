// Package warm fills the node's chunk cache with whole versions (or the
// files a glob names) before anything mounts them, records which versions
// the cache holds, and keeps a declared list of references warm in the
// background within the cache's bound.
package warm
