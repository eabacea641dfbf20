set -u
mkdir -p /tmp/s && cd /tmp/s
for b in kbase kfirst; do xz -dc $REPO_DIR/.dev/carry/ab/$b.xz > $b && chmod +x $b; done
K=_ZN15flash_attention4sm9014forward_kernelILy6341631778268119782ELb0ELb0ELb0EEEvNS0_6ParamsE
for b in kbase kfirst; do
  cuobjdump -sass -fun $K $b > $b.sass 2>&1
  echo "$b: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $b.sass) instructions; HGMMA $(grep -c HGMMA $b.sass); STL $(grep -c STL $b.sass); LDL $(grep -c LDL $b.sass); BAR $(grep -c 'BAR' $b.sass); SYNCS $(grep -c SYNCS $b.sass)"
done
for b in kbase kfirst; do sed -E 's@/\*[0-9a-f]{4}\*/@@; s@/\* 0x[0-9a-f]+ \*/@@' $b.sass | grep -E '^\s+[A-Z@]' | awk '{$1=$1};1' | sed -E 's/0x[0-9a-f]+/X/g' > $b.ops; done
diff kbase.ops kfirst.ops | grep -c '^[<>]'
diff kbase.ops kfirst.ops | head -80
cp *.sass $OUT/
